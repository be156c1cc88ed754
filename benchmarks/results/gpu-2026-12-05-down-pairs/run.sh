#!/usr/bin/env bash
# Device call (about 4 minutes, its time limits adding up to 300 s): one token's down kernel with a program per
# (column tile, expert) (COMMIT) against one program per column tile looping over the experts (BEFORE: the same
# tree with src/specdeploy/engine/triton_moe.py as .ab/triton_moe.py holds it). The one-token MoE GPU tests and the
# fp32 greedy-equality tests of the MLA + MoE families, then mla-moe-16b's AR step before and after in turn, three
# times each, then the AR kernel profile after. Run from the repository root with OUT, COMMIT and BEFORE set, after
# `mkdir -p .ab && git show $BEFORE:src/specdeploy/engine/triton_moe.py > .ab/triton_moe.py` here (.ab/ is not
# committed; carry it).
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_fastpath.py \
  tests/test_decode_gpu.py -k "one_token or (fp32 and (kimi or deepseek))" > "$R/gpu_tests.log" 2>&1
tail -2 "$R/gpu_tests.log"; pack
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r src benchmarks /tmp/before/ && cp .ab/triton_moe.py /tmp/before/src/specdeploy/engine/
for round in 1 2 3; do
  for side in before after; do
    if [ $side = before ]; then root=/tmp/before; else root=.; fi
    (cd $root && PYTHONPATH=/tmp/site:$root/src timeout 50 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape mla-moe-16b \
      --modes ar --commit "$COMMIT-$side" --out "$R/ar_${round}_$side.json" > "$R/ar_${round}_$side.log" 2>&1)
    echo "$round $side $(grep -E '^ar ' $R/ar_${round}_$side.log)"
  done
  pack
done
timeout 40 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --out "$R/profile_mla_ar.json" \
  > "$R/profile_mla_ar.txt" 2>&1; grep -E "kernels|gemv" "$R/profile_mla_ar.txt"
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log; pack
