#!/usr/bin/env bash
# Device call (about 9 minutes): the few-row projection kernel (`triton_gemv.linear_rows`) and the LM head through
# `ops.linear`. GPU tests of the kernels and of greedy decoding in every family; the few-row kernel's tiles against
# cuBLAS by rows and weight size (`rows_linear_sweep.py`); the zoo pairs with the few-row kernel and without
# (`with_moe_one_token.py rows:cublas`), in one tree; mla-moe-16b's and Qwen3-8B's AR step with the LM head through
# `ops.linear` and through cuBLAS (this tree with ab_before/ laid over it: $BEFORE's step.py). Each run a process of
# its own. Run from the repository root with OUT, COMMIT and BEFORE set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
mkdir -p /tmp/before && cp -r src benchmarks /tmp/before/ && cp -r ab_before/. /tmp/before/
timeout 70 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py -k "few_rows or one_row_linear" \
  > "$R/gpu_tests_linear.log" 2>&1
tail -2 "$R/gpu_tests_linear.log"; pack
timeout 80 python3 -m pytest -q -m gpu tests/test_decode_gpu.py -k "fp32 or bf16" > "$R/gpu_tests_decode.log" 2>&1
tail -2 "$R/gpu_tests_decode.log"; pack
timeout 130 python3 benchmarks/rows_linear_sweep.py --shapes zoo,mid,mla-moe-16b --rows 16,17,65,128 \
  --out "$R/rows_sweep.json" > "$R/rows_sweep.log" 2>&1
cat "$R/rows_sweep.log"; pack
zoo() {  # $1 label, $2 setting (- for the defaults)
  local run=(python3 benchmarks/zoo_pair_speed.py)
  [ "$2" != - ] && run=(python3 benchmarks/with_moe_one_token.py "$2" benchmarks/zoo_pair_speed.py)
  timeout 55 "${run[@]}" --pair tiny-code,tiny-hybrid --budgets 16,64 --out "$R/zoo_$1.json" > "$R/zoo_$1.log" 2>&1
  echo "zoo $1:"; tail -10 "$R/zoo_$1.log"; pack
}
zoo cublas rows:cublas
zoo rows -
side() {  # $1 tree, $2 label, $3 shape, $4 time limit
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$4" python3 benchmarks/ddtree_side_by_side.py --engine-only \
    --shape "$3" --modes ar --commit "$2" --out "$R/engine_$3_$2.json" > "$R/engine_$3_$2.log" 2>&1)
  echo "$3 $2:"; grep -E "^engine |^ar" "$R/engine_$3_$2.log" || tail -1 "$R/engine_$3_$2.log"; pack
}
side /tmp/before "$BEFORE" mla-moe-16b 50
side . "$COMMIT" mla-moe-16b 50
side /tmp/before "$BEFORE" qwen3-8b 45
side . "$COMMIT" qwen3-8b 45
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*.json "$R"/*.log; pack
