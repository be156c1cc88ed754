#!/usr/bin/env bash
# Device call for an H200 with little device time left (about 5 minutes of work): the DeepSeek and Kimi float32
# greedy decoding tests on CUDA (the norm in the router's kernel), mla-moe-16b's AR step in the tree before that
# change (ab_before/: $BEFORE's src) and at the head (AR, DFlash, DDTree-64), then the 4-layer Kimi-like shape (AR,
# DFlash, DDTree-64), which needs more than an H100's memory. Run from the repository root with specdeploy
# importable and OUT, COMMIT and BEFORE set.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}" "${BEFORE:?set BEFORE}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/machine.txt"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$OUT/machine.txt"
cat "$OUT/machine.txt"
side() {  # $1 tree, $2 label, $3 shape, $4 modes, $5 time limit
  (cd "$1" && PYTHONPATH="$PWD/src" timeout "$5" python3 "$OLDPWD/benchmarks/ddtree_side_by_side.py" --engine-only \
    --shape "$3" --modes "$4" --commit "$2" --out "$OUT/engine_$3_$2.json" > "$OUT/engine_$3_$2.log" 2>&1)
  echo "$2 $3"; grep -E "^(mode|ar|dflash|ddtree)" "$OUT/engine_$3_$2.log"
}
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode_gpu.py -k "fp32 and (deepseek or kimi)" \
  > "$OUT/gpu_decode_tests.log" 2>&1; tail -3 "$OUT/gpu_decode_tests.log"
side ab_before "$BEFORE" mla-moe-16b ar 50
side . "$COMMIT" mla-moe-16b ar,dflash,ddtree-64 90
side . "$COMMIT" kimi-like ar,dflash,ddtree-64 130
sed -i "s#$PWD/##g" "$OUT"/*.log "$OUT"/*.json 2>/dev/null
