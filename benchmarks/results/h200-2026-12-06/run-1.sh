#!/usr/bin/env bash
# Device call (under 10 minutes): issue 19's bars at the head, `benchmarks/gpu_hybrid.py` with every stage (zoo
# pairs, the Qwen3.6-27B shape, the dense Qwen3-8B check, the budget sweeps, the GPU tests in the time left). Run
# from the repository root with OUT and COMMIT set, the wheels of `.whl/` installed and src importable.
set -u
R="$OUT/r"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$R/machine.txt"
cat "$R/machine.txt"
OUT=$R python3 benchmarks/gpu_hybrid.py --commit "$COMMIT" > "$R/gpu_hybrid.log" 2>&1
tail -30 "$R/gpu_hybrid.log"
ls -la "$R"
