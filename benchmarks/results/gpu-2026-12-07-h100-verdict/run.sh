#!/usr/bin/env bash
# Issue 20's bars on the card that comes (an H100 more often than not), under 10 minutes: 1) the dense qwen3-8b shape
# at this tree and at e1ce3fa (the commit of the committed H200 dense results, unpacked from .device/base.tgz into
# /tmp/base), one process each, so that the no-regression bar compares two runs on one card; 2) the whole GPU test
# selection of `gpu_kimi_roofline.py` (the MoE, MLA and one-row kernels, and fp32 decoding of deepseek_v3 and kimi)
# in what is left of BUDGET_S (560 s). Run from the repository root with specdeploy importable and OUT and COMMIT set.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
T0=$(date +%s)
left() { echo $((${BUDGET_S:-560} - $(date +%s) + T0)); }
pack() { sed -i "s#$PWD/##g; s#$OUT/##g; s#/tmp/base/##g" "$OUT"/*.txt "$OUT"/*.json "$OUT"/*.xml 2>/dev/null; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
mkdir -p /tmp/base && tar xzf .device/base.tgz -C /tmp/base || { echo "no .device/base.tgz"; exit 1; }
dense() {  # $1 tree, $2 label
    (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout 110 python3 benchmarks/ddtree_side_by_side.py --engine-only \
      --shape qwen3-8b --modes ar,dflash,ddtree-64,ddtree-256 --commit "$2" --out "$OUT/engine_qwen3-8b_$2.json" \
      > "$OUT/engine_qwen3-8b_$2.txt" 2>&1)
    echo "qwen3-8b at $2:"; tail -6 "$OUT/engine_qwen3-8b_$2.txt"; pack
}
dense . "$COMMIT"
dense /tmp/base e1ce3fa
timeout "$(( $(left) - 10 ))" python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
  -k "moe or routing or mla or one_row or norm_linear or swiglu or (fp32 and (deepseek_v3 or kimi))" \
  --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.txt" 2>&1
echo "pytest rc $?"; tail -4 "$OUT/gpu_tests.txt"; pack
echo "seconds used in all: $(( $(date +%s) - T0 ))"
