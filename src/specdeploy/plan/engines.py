"""Which server build runs a plan: SGLang releases, the unmerged DDTree build, the reference engine."""

from __future__ import annotations

from specdeploy import __version__
from specdeploy.plan.launch_plan import EngineSpec

SGLANG_VERSION = "0.5.23"
SGLANG_IMAGE = f"lmsysorg/sglang:v{SGLANG_VERSION}-cu130"
SGLANG_REPO = "https://github.com/sgl-project/sglang"

# DDTree lives in SGLang PR #29907 (open, not merged). The commit is the newest one of that PR the public
# index holds (DDTreeWorker on DFlashWorkerV2); the PR's head may have moved since.
DDTREE_PR = 29907
DDTREE_COMMIT = "93e9850e430035f8a363fd881a6a0c5436b95108"
DDTREE_SOURCE_DIR = "/opt/sglang-ddtree"
# What the PR adds to the command line and environment on top of 0.5.23 (read from the PR itself). The
# commit's ServerArgs also declares every other flag a DDTree plan passes (cuda_graph_max_bs_decode,
# speculative_draft_attention_backend, speculative_num_draft_tokens, page_size, ...), checked by reading it.
DDTREE_ALGORITHM = "DDTREE"
DDTREE_FLAGS = ("--speculative-ddtree-budget",)
DDTREE_ENV = ("SGLANG_DDTREE_MAX_TOPK", "SGLANG_DDTREE_DEPTH_BONUS", "SGLANG_DDTREE_RANK_PROBE")
# The PR's full-tree mode (budget > block_size - 1) accepts only this attention backend.
DDTREE_TREE_BACKENDS = ("triton",)


def sglang_release() -> EngineSpec:
    return EngineSpec(
        name="sglang", version=SGLANG_VERSION, image=SGLANG_IMAGE, source=f"sglang=={SGLANG_VERSION}"
    )


def sglang_ddtree_build() -> EngineSpec:
    """The PR's source installed into the release image, with the dependency pins of its own branch.

    The PR branched from an older main than 0.5.23 (its argument hooks predate 0.5.23's), so it brings its
    own compiled-kernel pins rather than trusting the image's.
    """
    return EngineSpec(
        name="sglang",
        version=f"pr{DDTREE_PR}-{DDTREE_COMMIT[:10]}",
        image=SGLANG_IMAGE,
        source=f"git+{SGLANG_REPO}@{DDTREE_COMMIT}#subdirectory=python",
        install=[
            f"git clone --filter=blob:none {SGLANG_REPO} {DDTREE_SOURCE_DIR}",
            f"git -C {DDTREE_SOURCE_DIR} fetch origin pull/{DDTREE_PR}/head",
            f"git -C {DDTREE_SOURCE_DIR} checkout {DDTREE_COMMIT}",
            f"pip install -e {DDTREE_SOURCE_DIR}/python",
        ],
    )


def reference_engine() -> EngineSpec:
    return EngineSpec(name="reference", version=__version__, image=None, source=f"specdeploy=={__version__}")
