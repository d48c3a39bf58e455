"""The sha256 of a (large) output file, read in chunks: what the conversion manifests record per shard."""

from __future__ import annotations

import hashlib
import os

_HASH_CHUNK = 8 << 20


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()
