"""What SGLang PR #29907 (DDTree) can run, as recorded in ddtree_facts.toml, and the checks that follow."""

from __future__ import annotations

import sys
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no TOML reader in the standard library
    import tomli as tomllib

FACTS_FILE = "ddtree_facts.toml"


class _Facts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TestedUpstream(_Facts):
    attention: list[str]


class TreeBuffers(_Facts):
    bytes_per_cell: int
    source: str


class DDTreeFacts(_Facts):
    pr: int
    commit: str
    repo: str
    read_from: list[str]
    spine_margin: int
    full_tree_backends: list[str]
    full_tree_page_size: int
    page_size_snapped: dict[str, int]
    chain_only: dict[str, str]
    tested_upstream: TestedUpstream
    tree_buffers: TreeBuffers

    @property
    def source(self) -> str:
        return f"SGLang PR #{self.pr} at {self.commit[:10]}"

    def is_full_tree(self, budget: int, block_size: int) -> bool:
        """Above block_size - spine_margin the PR verifies a branching tree; at or below it, one chain."""
        return budget > block_size - self.spine_margin

    def full_tree_refusal(self, backend: str) -> str | None:
        """Why `backend` cannot run a full tree in the PR, or None when it can."""
        if backend in self.full_tree_backends:
            return None
        needs = (
            f"full-tree DDTree needs the {' or '.join(self.full_tree_backends)} attention backend for prefill and "
            f"decode and page size {self.full_tree_page_size} ({self.source})"
        )
        if backend in self.page_size_snapped:
            return (
                f"attention backend {backend} sets its own page size ({self.page_size_snapped[backend]}) before "
                f"the PR checks it, so the server refuses to start even with --page-size "
                f"{self.full_tree_page_size}: {needs}"
            )
        if backend in self.chain_only:
            return f"{self.chain_only[backend]} in the PR, no branching tree: {needs}"
        return f"attention backend {backend} has no tree-mask path in the PR: {needs}"

    def tree_buffer_bytes(self, budget: int, batch: int, context: int) -> int:
        """Triton's CUDA-graph buffers for tree verify: (budget + 1) x batch x context cells."""
        return (budget + 1) * batch * context * self.tree_buffers.bytes_per_cell


@cache
def ddtree_facts() -> DDTreeFacts:
    text = (resources.files("specdeploy.plan") / FACTS_FILE).read_text(encoding="utf-8")
    return DDTreeFacts.model_validate(tomllib.loads(text))
