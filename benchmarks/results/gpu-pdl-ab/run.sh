#!/usr/bin/env bash
# Device call (about 9 minutes, its time limits adding up to 500 s): programmatic dependent launch
# (`engine/triton_launch.py`, SPECDEPLOY_PDL=1) against the default, in the same tree. First the fp32
# greedy-equality tests and the batched hybrid tests with it on (every family, CUDA graphs), then processes in
# turn, off and on: mla-moe-16b's AR step (297 launches; the first process of each compiles its kernels,
# hence the longer limit), then the zoo pairs at batch 1 (tiny-code and tiny-hybrid: AR, DFlash, DDTree-16 and
# -64, stage times). Run from the repository root with OUT and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
SPECDEPLOY_PDL=1 timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_decode_gpu.py \
  tests/test_batch_gpu.py -k "fp32 or hybrid" > "$R/gpu_tests_pdl.log" 2>&1; tail -2 "$R/gpu_tests_pdl.log"; pack
for round in 1 2; do
  for pdl in 0 1; do
    limit=$([ $round = 1 ] && echo 70 || echo 30)
    SPECDEPLOY_PDL=$pdl timeout $limit python3 benchmarks/ddtree_side_by_side.py --engine-only --shape mla-moe-16b \
      --modes ar --commit "$COMMIT-pdl$pdl" --out "$R/mla_${round}_pdl$pdl.json" > "$R/mla_${round}_pdl$pdl.log" 2>&1
    echo "mla round $round pdl $pdl: $(grep -E '^ar ' $R/mla_${round}_pdl$pdl.log)"
  done
  pack
done
for pdl in 0 1; do
  SPECDEPLOY_PDL=$pdl timeout 75 python3 benchmarks/zoo_pair_speed.py --pair tiny-code,tiny-hybrid --budgets 16,64 \
    --stage-times --out "$R/zoo_pdl$pdl.json" > "$R/zoo_pdl$pdl.log" 2>&1
  echo "zoo pdl $pdl"; tail -12 "$R/zoo_pdl$pdl.log"; pack
done
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log; pack
