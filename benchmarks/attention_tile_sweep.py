"""Which tiles make the masked-attention kernel fastest, per head shape, query tokens and window, on one CUDA GPU.

For each head shape (MLA's 576-wide latent head with 16 or 64 query heads, whose values are the keys' first 512
channels; Qwen3-8B's 8 key heads of 128 with 4 queries each; Qwen3.6-27B's 4 of 256 with 6) and each count of
query tokens (1: decode; 17, 65, 257: a DFlash block or DDTree tree), times `masked_attention` over a window of
cache slots replayed from a CUDA graph, with the default tiles and with every tile of the grid below, against
the bytes the call had to read (the window's keys, values unless they are the keys, queries and outputs) at the
copy bandwidth measured in the same run, and its matrix FLOPs. Enough layers' caches are cycled that no call
finds the last one's keys in L2. Writes JSON as it goes.

    python benchmarks/attention_tile_sweep.py --heads mla-16,mla-64,gqa-128,gqa-256 --tokens 1,17,65,257 \\
        --window 768 --out attention_sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_timing import graph_replay_ms  # noqa: E402

from specdeploy.engine.triton_kernels import (  # noqa: E402
    AttentionTiles,
    default_attention_tiles,
    masked_attention,
)
from specdeploy.perf.roofline import copy_bandwidth  # noqa: E402

# name -> (key heads, query heads per key head, key width, value width, values are the keys' first channels)
HEADS = {
    "mla-16": (1, 16, 576, 512, True),  # mla-moe-16b (Moonlight / DeepSeek-V2-Lite widths)
    "mla-64": (1, 64, 576, 512, True),  # Kimi K2.6
    "gqa-128": (8, 4, 128, 128, False),  # Qwen3-8B
    "gqa-256": (4, 6, 256, 256, False),  # Qwen3.6-27B's gated attention layers
}
GRID = [
    AttentionTiles(m, n, warps, stages)
    for m, n in itertools.product((16, 32, 64), (16, 32, 64))
    for warps, stages in ((4, 2), (4, 3), (8, 2), (8, 3))
]
CACHE_BYTES = 96 << 20  # layers' caches cycled per call, at least this many bytes (the H200's L2 is 50 MB)


class Workload:
    """Query tokens and per-layer caches of one head shape; the mask lets each token see the window's prefix
    and itself, as a tree token sees the prompt and its ancestors (the kernel's work is the same either way)."""

    def __init__(self, heads: tuple, tokens: int, window: int, device: str = "cuda") -> None:
        kv_heads, group, width, value_width, latent = heads
        bf16 = {"dtype": torch.bfloat16, "device": device}
        self.q = torch.randn(1, kv_heads, group, tokens, width, **bf16)
        layer_bytes = window * kv_heads * (width + (0 if latent else value_width)) * 2
        self.layers = max(1, min(64, -(-CACHE_BYTES // layer_bytes)))
        self.caches = []
        for _ in range(self.layers):
            keys = torch.randn(1, window, kv_heads, width, **bf16)
            values = (
                keys[..., :value_width] if latent else torch.randn(1, window, kv_heads, value_width, **bf16)
            )
            self.caches.append((keys, values))
        slot = torch.arange(window, device=device)
        token = torch.arange(tokens, device=device)
        self.visible = (slot[None, :] < window - tokens + 1 + token[:, None])[None]
        self.scale = width**-0.5
        out_bytes = tokens * kv_heads * group * value_width * 2
        self.bytes = layer_bytes + self.q.numel() * 2 + out_bytes
        self.flops = 2 * kv_heads * group * tokens * window * (width + value_width)

    def call(self, tiles: AttentionTiles | None) -> None:
        for keys, values in self.caches:
            masked_attention(self.q, keys, values, self.visible, self.scale, tiles)

    def ms(self, tiles: AttentionTiles) -> float:
        """Milliseconds per call at `tiles`, replayed from a CUDA graph of one call per layer's cache."""
        return graph_replay_ms(lambda: self.call(tiles)) / self.layers


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heads", default=",".join(HEADS), help=f"of {', '.join(HEADS)}")
    parser.add_argument("--tokens", default="1,17,65,257")
    parser.add_argument("--window", type=int, default=768, help="cache slots attended (prompt + tree)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    unknown = set(args.heads.split(",")) - set(HEADS)
    if unknown:
        parser.error(f"unknown --heads {', '.join(sorted(unknown))}: use {', '.join(HEADS)}")
    bandwidth = copy_bandwidth(torch.device("cuda"))
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_tb_per_s": bandwidth / 1e12,
        "window": args.window,
        "grid": [list(t) for t in GRID],
        "heads": {},
    }
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    for name in args.heads.split(","):
        result["heads"][name] = {}
        for tokens in (int(t) for t in args.tokens.split(",")):
            started = time.perf_counter()
            work = Workload(HEADS[name], tokens, args.window)
            _, group, width, _, _ = HEADS[name]
            default = default_attention_tiles(group * tokens, width, work.q.element_size())
            default_ms = work.ms(default)
            rows = []
            for tiles in GRID:
                try:
                    rows.append({"tiles": list(tiles), "ms": work.ms(tiles)})
                except Exception as error:  # a tile too large for registers or shared memory: not a choice
                    rows.append({"tiles": list(tiles), "error": str(error).splitlines()[0][:120]})
            best = min((r for r in rows if "ms" in r), key=lambda r: r["ms"])
            roofline_ms = work.bytes / bandwidth * 1e3
            entry = {
                "default": list(default),
                "default_ms": default_ms,
                "best": best["tiles"],
                "best_ms": best["ms"],
                "roofline_ms": roofline_ms,
                "default_tflop_s": work.flops / default_ms / 1e9,
                "best_tflop_s": work.flops / best["ms"] / 1e9,
                "layers_cycled": work.layers,
                "grid": rows,
                "seconds": time.perf_counter() - started,
            }
            result["heads"][name][str(tokens)] = entry
            args.out.write_text(json.dumps(result, indent=1))
            print(
                f"{name} tokens={tokens}: roofline {roofline_ms * 1e3:.1f} us, default {tuple(default)} "
                f"{default_ms * 1e3:.1f} us ({entry['default_tflop_s']:.0f} TFLOP/s), best {tuple(best['tiles'])} "
                f"{best['ms'] * 1e3:.1f} us ({entry['best_tflop_s']:.0f} TFLOP/s)",
                flush=True,
            )
            work = None  # its caches go before the next token count's
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
