#!/usr/bin/env bash
# One device call: the step's bookkeeping kernels on CUDA (the accept walk, the kept path's cache move, the rows'
# commit; trees written in place; rotary tables): their GPU tests (greedy equality in float32 with CUDA graphs on
# every family, the fast-path kernels), then issue 19's zoo stage (tiny-code and tiny-hybrid at batch 1, every
# mode's per-stage ms). Run from the repository root with OUT set, and COMMIT set to the commit measured.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
log start
timeout 230 python -m pytest -m gpu -q -x tests/test_batch_gpu.py tests/test_decode_gpu.py tests/test_gpu_fastpath.py \
    > $R/gpu_tests.log 2>&1
log "gpu tests rc $?"
OUT=$R timeout 300 python benchmarks/gpu_hybrid.py --commit "${COMMIT:-unknown}" --stages zoo > $R/hybrid.log 2>&1
log "zoo rc $?"
