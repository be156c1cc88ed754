#!/usr/bin/env bash
# One device call after run-4.sh: where each step's device time goes now, kernel by kernel (eager, under
# torch.profiler): tiny-hybrid AR against DDTree-64 (issue 19: what is left of the DDTree step beyond the AR one),
# then mla-moe-16b's AR step (issue 20: the kernels per layer). Run from the repository root with OUT set.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
timeout 200 python benchmarks/kernel_profile.py --pair zoo:tiny-hybrid --prompt-tokens 64 --modes ar,ddtree-64 \
    --out $R/profile_tiny_hybrid.json > $R/profile_tiny_hybrid.txt 2>&1
log "tiny-hybrid rc $?"
timeout 300 python benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --out $R/profile_mla_ar.json \
    > $R/profile_mla_ar.txt 2>&1
log "mla-moe-16b rc $?"
