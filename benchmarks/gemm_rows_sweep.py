"""Time of the dense projections of a named shape against the number of token rows (CUDA, bf16, cuBLAS).

    python benchmarks/gemm_rows_sweep.py --shape qwen3.6-27b --rows 1,16,17,32,64,65,80,128 --out sweep.json

A verify of a DDTree budget b multiplies b + 1 rows by every weight: this shows whether b + 1 rows cost what their
bytes and FLOPs say, or whether the row count falls between cuBLAS's tiles (65 rows against 64, say). Each weight
is timed alone, replayed from a CUDA graph (`cuda_timing`), against the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_timing import graph_replay_ms  # noqa: E402

from specdeploy.perf.roofline import copy_bandwidth  # noqa: E402
from specdeploy.perf.shapes import get_shape  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="qwen3.6-27b")
    parser.add_argument("--rows", default="1,16,17,32,33,64,65,72,80,96,128")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = get_shape(args.shape).target
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    weights = {"gate_up": (2 * inter, hidden), "down": (hidden, inter)}
    bandwidth = copy_bandwidth(torch.device("cuda"))
    result = {"shape": args.shape, "copy_tb_per_s": bandwidth / 1e12, "weights": {}}
    for name, (out_features, in_features) in weights.items():
        weight = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16)
        roofline_ms = weight.numel() * 2 / bandwidth * 1e3
        rows = {}
        for count in (int(r) for r in args.rows.split(",")):
            x = torch.randn(count, in_features, device="cuda", dtype=torch.bfloat16)
            ms = graph_replay_ms(lambda x=x, w=weight: torch.nn.functional.linear(x, w))
            rows[count] = {"ms": ms, "x_roofline": ms / roofline_ms}
            print(f"{name} [{out_features}x{in_features}] rows {count:4d}: {ms * 1e3:8.1f} us "
                  f"({ms / roofline_ms:.2f}x its bytes at the copy bandwidth)", flush=True)  # fmt: skip
        result["weights"][name] = {
            "shape": [out_features, in_features],
            "roofline_ms": roofline_ms,
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
