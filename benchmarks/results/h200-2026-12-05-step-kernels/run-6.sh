#!/usr/bin/env bash
# run-4.sh and run-5.sh in one device call (each stage under its own time limit, results written as they come):
# the GPU tests, issue 19's zoo stage, then the kernel profiles of tiny-hybrid AR / DDTree-64 and of mla-moe-16b's
# AR step. Run from the repository root with OUT set, and COMMIT set to the commit measured.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
log start
timeout 200 python -m pytest -m gpu -q -x tests/test_batch_gpu.py tests/test_decode_gpu.py tests/test_gpu_fastpath.py \
    > $R/gpu_tests.log 2>&1
log "gpu tests rc $?"
OUT=$R timeout 120 python benchmarks/gpu_hybrid.py --commit "${COMMIT:-unknown}" --stages zoo > $R/hybrid.log 2>&1
log "zoo rc $?"
timeout 110 python benchmarks/kernel_profile.py --pair zoo:tiny-hybrid --prompt-tokens 64 --modes ar,ddtree-64 \
    --out $R/profile_tiny_hybrid.json > $R/profile_tiny_hybrid.txt 2>&1
log "tiny-hybrid profile rc $?"
timeout 100 python benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --out $R/profile_mla_ar.json \
    > $R/profile_mla_ar.txt 2>&1
log "mla-moe-16b profile rc $?"
