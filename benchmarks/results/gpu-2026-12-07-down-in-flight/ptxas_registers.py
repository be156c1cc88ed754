"""Registers and spill bytes a thread of one token's down kernel (`triton_moe._down_gemv_kernel`) takes on sm_90, on a
machine without a GPU: Triton compiles the kernel ahead of time and its bundled ptxas reports the usage.

    python benchmarks/results/gpu-2026-12-07-down-in-flight/ptxas_registers.py            # this tree's kernel
    python benchmarks/results/gpu-2026-12-07-down-in-flight/ptxas_registers.py --patched  # down-in-flight.patch's

Each line: the shape (mla-moe-16b: 6 routed experts and a shared one of two experts' width; Kimi: 8 and one), the
tiles (columns a program, reduction tile, warps, stages), registers a thread, spill-store bytes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
os.environ["SPECDEPLOY_PDL"] = "1"  # the wait of programmatic dependent launch compiled in, as on the GPU

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

SIGNATURE = {"act_ptr": "*bf16", "w2_ptr": "*bf16", "shared2_ptr": "*bf16", "indices_ptr": "*i64",
             "weight_ptr": "*fp32", "out_ptr": "*bf16", "top_k": "i32", "hidden": "i32", "inter": "i32",
             "shared_inter": "i32", "stride_we": "i32", "stride_act": "i32"}  # fmt: skip
TILES = [(4, 2048, 4, 3), (2, 1024, 4, 2), (1, 2048, 4, 1), (1, 2048, 8, 1), (1, 1024, 4, 2), (1, 512, 4, 3),
         (2, 512, 4, 3), (4, 512, 4, 3), (4, 256, 4, 3)]  # fmt: skip
SHAPES = {"mla-moe-16b": (8, 2), "kimi": (8, 1)}  # the patched kernel's PAIRS and SEGMENTS


def usage(ptx: str) -> tuple[int, int]:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as file:
        file.write(ptx)
        file.flush()
        report = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", file.name, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr  # fmt: skip
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    assert registers and spills, report
    return int(registers.group(1)), int(spills.group(1))


def report(src: Path) -> None:
    sys.path.insert(0, str(src))
    from specdeploy.engine import triton_moe

    kernel = triton_moe._down_gemv_kernel
    names = {param.name for param in kernel.params}
    for shape, (pairs, segments) in SHAPES.items():
        for block_n, block_k, warps, stages in TILES:
            constants = {"SHARED": True, "BLOCK_N": block_n, "BLOCK_K": block_k}
            constants |= {k: v for k, v in (("PAIRS", pairs), ("SEGMENTS", segments)) if k in names}
            signature = SIGNATURE | {name: "constexpr" for name in constants}
            binary = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": warps, "num_stages": stages})  # fmt: skip
            registers, spills = usage(binary.asm["ptx"])
            print(f"{shape} {block_n}x{block_k}x{warps}x{stages}: {registers} registers, {spills} spill bytes",
                  flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--patched", action="store_true", help="down-in-flight.patch laid over a copy of src and tests"
    )
    if not parser.parse_args().patched:
        report(ROOT / "src")
        return
    with tempfile.TemporaryDirectory() as copy:
        subprocess.run(["cp", "-r", str(ROOT / "src"), str(ROOT / "tests"), copy], check=True)
        patch = Path(__file__).with_name("down-in-flight.patch")
        subprocess.run(["patch", "-s", "-p1", "-i", str(patch)], cwd=copy, check=True)
        report(Path(copy) / "src")


if __name__ == "__main__":
    main()
