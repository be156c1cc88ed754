"""File locks that keep two `zoo train` invocations from writing the same data or pair at once."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeploy.errors import SpecdeployError


@contextmanager
def exclusive(path: Path, wait: bool, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed); without `wait`, refuse when it is taken.

    The kernel drops the lock when the holder exits, however it exits, so a crash never leaves it behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise SpecdeployError(
                f"{what} is in use by {holder}: wait for it to finish (each invocation stops at its "
                "--max-minutes), then run the command again"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
