"""One-off (capture_alone_bd0f446.txt): capture the DeepSeek-V3 test model's padded prefill stage by hand.

    PYTHONPATH=src python benchmarks/results/h200-2026-12-04-prefill-graphs/capture/capture_alone.py 64 bfloat16

One warm-up of `StepRunner._prefill_chunk` on a side stream, then a capture, both under inference mode;
prints OK or the capture's error.
"""

import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, "tests")
from decode_helpers import write_pair  # noqa: E402

from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.engine.step import StepRunner  # noqa: E402

bucket, dtype = int(sys.argv[1]), getattr(torch, sys.argv[2])
target_dir, draft_dir = write_pair(Path(tempfile.mkdtemp()), "deepseek_v3")
target, drafter = load_target(target_dir, "cuda", dtype), load_drafter(draft_dir, "cuda", dtype)
runner = StepRunner(target, drafter, "ddtree", 8, rows=1, cuda_graphs=False, fixed_shapes=True)
runner.reserve(200)
runner.prefill_count.fill_(5)
with torch.inference_mode():
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        runner._prefill_chunk(bucket)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            runner._prefill_chunk(bucket)
        print("OK prefill", bucket, flush=True)
    except Exception as exc:  # the capture's own error is what this reports
        print("FAIL prefill", bucket, type(exc).__name__, str(exc).splitlines()[0], flush=True)
        traceback.print_exc(limit=6)
