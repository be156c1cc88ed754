#!/usr/bin/env bash
# One device call: the GPU tests at the commit measured (COMMIT), issue 19's zoo stage before (BEFORE: the
# same tree with src/specdeploy/engine/triton_gdn.py as .ab/triton_gdn.py holds it, the Gated DeltaNet walk
# loading one token at a time) and after, the dense Qwen3-8B shape against the committed results, then kernel profiles of tiny-hybrid AR / DDTree-64 and of
# mla-moe-16b's AR step. Results are written as each stage ends. Run from the repository root with OUT, COMMIT
# and BEFORE set, after `mkdir -p .ab && git show $BEFORE:src/specdeploy/engine/triton_gdn.py > .ab/triton_gdn.py`
# here (.ab/ is not committed), and with opentelemetry-api among the wheels (fastapi 0.165 imports it).
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
log start
timeout 150 python -m pytest -m gpu -q -x tests/test_batch_gpu.py tests/test_decode_gpu.py tests/test_gpu_fastpath.py \
    > $R/gpu_tests.log 2>&1
log "gpu tests rc $?"
rm -rf /tmp/before && mkdir /tmp/before && cp -r src benchmarks /tmp/before/ && cp .ab/triton_gdn.py /tmp/before/src/specdeploy/engine/
PYTHONPATH=/tmp/site timeout 80 python /tmp/before/benchmarks/zoo_pair_speed.py --pair tiny-code,tiny-hybrid \
    --budgets 16,64 --stage-times --out $R/zoo_pairs_${BEFORE}.json > $R/zoo_before.log 2>&1
log "zoo before rc $?"
OUT=$R timeout 160 python benchmarks/gpu_hybrid.py --commit "$COMMIT" --stages zoo,qwen3-8b > $R/hybrid.log 2>&1
log "zoo after and qwen3-8b rc $?"
timeout 80 python benchmarks/kernel_profile.py --pair zoo:tiny-hybrid --prompt-tokens 64 --modes ar,ddtree-64 \
    --out $R/profile_tiny_hybrid.json > $R/profile_tiny_hybrid.txt 2>&1
log "tiny-hybrid profile rc $?"
timeout 70 python benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --out $R/profile_mla_ar.json \
    > $R/profile_mla_ar.txt 2>&1
log "mla-moe-16b profile rc $?"
