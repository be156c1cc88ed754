#!/usr/bin/env bash
# Device call (up to 9 minutes): the masked-attention kernel's tile grid (benchmarks/attention_tile_sweep.py) for
# the query counts of a DFlash block and of DDTree trees (17, 65, 257 tokens) over a 768-slot window: MLA's latent
# head with 16 query heads (mla-moe-16b), Qwen3.6-27B's 256-wide heads, Qwen3-8B's, then Kimi's 64 query heads.
# Run from the repository root with OUT and COMMIT set; the JSON is written after every (head shape, tokens).
set -u
R="$OUT/r"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
timeout 520 python3 benchmarks/attention_tile_sweep.py --heads mla-16,gqa-256,gqa-128,mla-64 --tokens 17,65,257 \
  --window 768 --out "$R/attention_sweep_$COMMIT.json" > "$R/attention_sweep_$COMMIT.log" 2>&1
cat "$R/attention_sweep_$COMMIT.log"
