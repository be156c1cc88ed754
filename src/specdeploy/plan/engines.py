"""Which server build runs a plan: SGLang releases, the unmerged DDTree build, the reference engine."""

from __future__ import annotations

from specdeploy import __version__
from specdeploy.plan.ddtree import ddtree_facts
from specdeploy.plan.image import image_tag
from specdeploy.plan.launch_plan import EngineSpec, ImageBuild
from specdeploy.recipes.lock import LockFile

SGLANG_VERSION = "0.5.23"
SGLANG_IMAGE = f"lmsysorg/sglang:v{SGLANG_VERSION}-cu130"

# DDTree lives in SGLang PR #29907 (open, not merged); its commit and limits are recorded in ddtree_facts.toml.
# The commit is the newest one of that PR the public index holds; the PR's head may have moved since.
DDTREE_PR = ddtree_facts().pr
DDTREE_COMMIT = ddtree_facts().commit
SGLANG_REPO = ddtree_facts().repo
DDTREE_SOURCE_DIR = "/opt/sglang-ddtree"
DDTREE_IMAGE_REPO = "specdeploy/sglang-ddtree"
# What the PR adds to the command line and environment on top of 0.5.23 (read from the PR itself). The
# commit's ServerArgs also declares every other flag a DDTree plan passes (cuda_graph_max_bs_decode,
# speculative_draft_attention_backend, speculative_num_draft_tokens, page_size, ...), checked by reading it.
DDTREE_ALGORITHM = "DDTREE"
DDTREE_FLAGS = ("--speculative-ddtree-budget",)
DDTREE_ENV = ("SGLANG_DDTREE_MAX_TOPK", "SGLANG_DDTREE_DEPTH_BONUS", "SGLANG_DDTREE_RANK_PROBE")
DDTREE_TREE_BACKENDS = tuple(ddtree_facts().full_tree_backends)


def release_image(lock: LockFile | None) -> str:
    """The release image by tag, or tag@digest when a lock pins it."""
    return lock.image.pinned if lock is not None else SGLANG_IMAGE


def sglang_release(lock: LockFile | None = None) -> EngineSpec:
    return EngineSpec(
        name="sglang", version=SGLANG_VERSION, image=release_image(lock), source=f"sglang=={SGLANG_VERSION}"
    )


def sglang_ddtree_build(lock: LockFile | None = None) -> EngineSpec:
    """The PR's source installed on top of the release image, built once into an image of its own.

    The PR branched from an older main than 0.5.23, so its dependencies differ from the image's; the lock pins
    the ones pip chose for it, so that every build installs the same.
    """
    build = ImageBuild(
        base=release_image(lock),
        repo=SGLANG_REPO,
        pull_request=DDTREE_PR,
        commit=DDTREE_COMMIT,
        source_dir=DDTREE_SOURCE_DIR,
        constraints=list(lock.ddtree.constraints) if lock is not None else [],
    )
    return EngineSpec(
        name="sglang",
        version=f"pr{DDTREE_PR}-{DDTREE_COMMIT[:10]}",
        image=image_tag(build, DDTREE_IMAGE_REPO),
        source=f"git+{SGLANG_REPO}@{DDTREE_COMMIT}#subdirectory=python",
        build=build,
    )


def reference_engine() -> EngineSpec:
    return EngineSpec(name="reference", version=__version__, image=None, source=f"specdeploy=={__version__}")
