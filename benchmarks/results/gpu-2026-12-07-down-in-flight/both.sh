#!/usr/bin/env bash
# Both of issue 20's open measurements in one device call of under 10 minutes, for sessions that may get one machine
# only: `run.sh` here (the AR step with the patched down kernel, into $OUT/down) and
# `../gpu-2026-12-07-head/mid-rows.sh` (DDTree-256's 257-token tiling at 32 rows per block, into $OUT/mid), each with
# its optional rounds cut to fit (under 450 s of BUDGET_S, 570, the first only). On an H200 the AR change goes first
# (down is the H200's weak kernel); elsewhere the tiling goes first. Run from the repository root with specdeploy
# importable and OUT and COMMIT set; $OUT receives down/results.tgz and mid/results.tgz.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
T0=$(date +%s)
left() { echo $((${BUDGET_S:-570} - $(date +%s) + T0)); }
# Raw files stay in a scratch folder: only the two archives come back, since a call returns at most 8 files (on
# 2026-12-07 the raw files of the first crowded out the second's archive).
down() { mkdir -p "$OUT/down"; RAW=$(mktemp -d) OUT="$OUT/down" BUDGET_S=$1 SWEEP_S=100 bash benchmarks/results/gpu-2026-12-07-down-in-flight/run.sh; }
mid() { mkdir -p "$OUT/mid"; RAW=$(mktemp -d) OUT="$OUT/mid" BUDGET_S=$1 SWEEP_S=90 ROWS=32 bash benchmarks/results/gpu-2026-12-07-head/mid-rows.sh; }
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then first=down second=mid; else first=mid second=down; fi
if [ "$(left)" -lt 450 ]; then  # too little for both: the first with all of it
    $first "$(left)"
else
    $first $(( $(left) / 2 )); $second "$(left)"
fi
echo "seconds used in all: $(( $(date +%s) - T0 ))"
