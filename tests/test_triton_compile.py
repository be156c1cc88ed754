"""Every Triton kernel the CUDA code path launches compiles for a Hopper GPU (sm_90), on this CPU.

The interpreter (test_triton_interpreted.py) runs a kernel's Python, so it cannot see what only the compiler
rejects (a loop-carried variable whose shape changes, say). Here a process per model family decodes in every
mode and with a changing DDTree budget along the CUDA code path under Triton's interpreter
(`SPECDEPLOY_TRITON=interpret`) and records each distinct launch: the kernel, its arguments' types and its
constexprs. Another compiles each of them to a cubin with Triton's ahead-of-time compiler and its own ptxas, with
programmatic dependent launch on (`SPECDEPLOY_PDL=1`), so that its grid-dependency instructions compile too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RECORD = textwrap.dedent(
    """
    import json
    import sys
    import tempfile
    from pathlib import Path

    import torch
    import triton.runtime.interpreter as interpreter

    sys.path.insert(0, "tests")
    from decode_helpers import write_pair
    from hybrid_helpers import write_drafter, write_target
    from test_batch import run, scripted_policy

    from specdeploy.engine.batch import BatchEngine
    from specdeploy.engine.loading import load_drafter, load_target
    from specdeploy.engine.sampling import SamplingParams

    TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
             torch.int32: "i32", torch.int8: "i8", torch.bool: "i1", torch.uint8: "u8"}

    def kind(value):  # [the type a non-constexpr parameter compiles as, the value a constexpr one takes]
        if isinstance(value, torch.Tensor):
            return ["*" + TYPES[value.dtype], None]
        if isinstance(value, int) and not isinstance(value, bool):
            return ["i32" if -(2**31) <= value < 2**31 else "i64", value]
        if isinstance(value, float):
            return ["fp32", value]
        return ["constexpr", value]  # None or a bool: Triton folds them in as constants

    launches = {}
    launch = interpreter.InterpretedFunction.run

    def recorded(self, *args, **kwargs):
        names = self.arg_names
        values = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
        entry = {"module": self.fn.__module__, "name": self.fn.__name__,
                 "args": {name: kind(value) for name, value in values.items()},
                 "options": {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}}
        launches[json.dumps(entry, sort_keys=True)] = entry
        return launch(self, *args, **kwargs)

    interpreter.InterpretedFunction.run = recorded
    root = Path(tempfile.mkdtemp())
    family = sys.argv[1]
    if family == "qwen3_next":
        pairs = {family: (write_target(family, root / "next"), write_drafter(root / "next-draft"))}
    else:
        pairs = {family: write_pair(root, family)}
    prompts = [[3, 17, 9, 41, 5], [7, 1, 30]]
    params = [SamplingParams(max_new_tokens=4, ignore_eos=True),
              SamplingParams(temperature=0.8, max_new_tokens=4, ignore_eos=True, seed=1)]
    # the Kimi-routed and Qwen3-MoE pairs with one request (one token per AR step: the experts as matrix-vector
    # kernels, with and without shared ones; Kimi's routed in one kernel)
    for family, (target_dir, draft_dir) in pairs.items():
        target = load_target(target_dir, dtype=torch.bfloat16)
        drafter = load_drafter(draft_dir, dtype=torch.bfloat16)
        # DDTree steps with the policy's predictions, and AR steps (budget 0) between them
        engine = BatchEngine(target, drafter, "ddtree", 8, max_running=2, max_context=96,
                             policy=scripted_policy([8, 0, 5]), fixed_shapes=True)
        requests = list(zip(prompts, params))[: 1 if family in ("kimi", "qwen3_moe") else None]
        run(engine, [(i, p, q) for i, (p, q) in enumerate(requests)])
    print(json.dumps(list(launches.values())))
    """
)

COMPILE = textwrap.dedent(
    """
    import importlib
    import json
    import multiprocessing
    import os
    import sys

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def compile_one(job):
        name, module, signature, constants, options = job
        kernel = getattr(importlib.import_module(module), name)
        try:
            binary = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                                    options=options)
        except Exception as exc:
            return name, f"{name} {constants}: {type(exc).__name__}: {str(exc)[-800:]}", False
        return name, None, "griddepcontrol.wait" in binary.asm["ptx"]

    jobs = {}
    for launch in json.load(sys.stdin):
        kernel = getattr(importlib.import_module(launch["module"]), launch["name"])
        signature, constants = {}, {}
        for param in kernel.params:
            kind, value = launch["args"][param.name]
            if param.is_constexpr or kind == "constexpr":
                constants[param.name] = value
                signature[param.name] = "constexpr"
            else:
                signature[param.name] = kind  # an int's value does not change what compiles
        key = json.dumps([launch["name"], signature, constants, launch["options"]], sort_keys=True)
        jobs[key] = (launch["name"], launch["module"], signature, constants, launch["options"])
    # one compiler process per core: the compiles are independent, and this test is among the suite's longest
    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        results = pool.map(compile_one, list(jobs.values()), chunksize=1)
    failures = [failure for _, failure, _ in results if failure]
    waiting = sorted({name for name, _, waits in results if waits})
    print(json.dumps({"compiled": len(jobs), "failures": failures, "waiting": waiting}))
    """
)


# dense attention; routed experts without shared ones; MLA and routed experts with shared ones (group-limited
# routing, and Kimi's); Gated DeltaNet
FAMILIES = ("qwen3", "qwen3_moe", "deepseek_v3", "kimi", "qwen3_next")


def test_every_kernel_the_cuda_path_launches_compiles_for_sm_90(tmp_path: Path) -> None:
    interpreted = {**os.environ, "TRITON_INTERPRET": "1", "SPECDEPLOY_TRITON": "interpret"}
    # one process per family, all at once: the interpreter is slow, and a CI machine has more than one core
    running = {
        family: subprocess.Popen(
            [sys.executable, "-c", RECORD, family], cwd=ROOT, env=interpreted, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for family in FAMILIES
    }  # fmt: skip
    launches = []
    for family, process in running.items():
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, (family, err[-3000:])
        launches += json.loads(out.strip().splitlines()[-1])
    names = {launch["name"] for launch in launches}
    # each family's own kernels were launched (else the run did not take the CUDA path)
    expected = {"_walk_kernel", "_move_kernel", "_commit_rows_kernel", "_keep_features_kernel", "_rms_norm_kernel",
                "_best_first_tree_kernel", "_tree_rule_kernel", "_gate_up_kernel",
                "_mla_query_entry_kernel", "_combine_up_kernel", "_gate_up_gemv_kernel", "_down_gemv_kernel",
                "_route_kernel", "_linear_row_kernel", "_linear_rows_kernel",
                "_norm_linear_row_kernel", "_swiglu_down_row_kernel"}  # fmt: skip
    assert expected <= names, expected - names
    compiled = subprocess.run(
        [sys.executable, "-c", COMPILE], cwd=ROOT, input=json.dumps(launches), capture_output=True, text=True,
        # compiled here, not found cached; with programmatic dependent launch's wait in every kernel
        # (`triton_launch`): the default leaves it out, which removes code and compiles wherever this compiles
        timeout=900, env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "SPECDEPLOY_PDL": "1"},
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    result = json.loads(compiled.stdout.strip().splitlines()[-1])
    assert not result["failures"], "\n".join(result["failures"])
    assert result["compiled"] >= len(names)
    assert set(result["waiting"]) == names  # every kernel compiled with the wait for the kernel before it
