"""Packing a trained pair's folder into a tar split into parts of bounded size, for shipping off a trainer."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path


def archive_pair(pair_dir: Path, archive_dir: Path, part_bytes: int) -> list[Path]:
    """Write `<name>.tar.partN` files holding `pair_dir`; rebuild with `cat <name>.tar.part* | tar x`.

    Parts are written under temporary names and renamed, so a reader never sees a half-written part; parts
    left over from a larger earlier archive are removed.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(pair_dir, arcname=pair_dir.name, filter=_skip_temporaries)
    data = buffer.getvalue()
    archive_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, offset in enumerate(range(0, len(data), part_bytes)):
        part = archive_dir / f"{pair_dir.name}.tar.part{index}"
        tmp = part.with_name(part.name + "-writing")
        tmp.write_bytes(data[offset : offset + part_bytes])
        os.replace(tmp, part)
        parts.append(part)
    for stale in archive_dir.glob(f"{pair_dir.name}.tar.part*"):
        if stale not in parts:
            stale.unlink()
    return parts


def _skip_temporaries(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    # Checkpoint folders being written or swapped out (see checkpoint.save_atomically), the resume state
    # and the lock are not the model.
    parts = info.name.split("/")
    skip = any(part.endswith((".tmp", ".old")) for part in parts) or (
        len(parts) > 1 and parts[1] in ("state", ".lock")
    )
    return None if skip else info
