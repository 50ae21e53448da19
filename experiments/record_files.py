"""The files an experiment record names: their canonical bytes, their entries, and reading one back verified.

A lab run writes every document it produces (recorded computations, observations,
cache runs, measured and decoding runs, the record itself) as canonical JSON bytes
and names each in the record by a file entry `{path, sha256, bytes}`. Whatever reads
a record back (replay, the report, the figures) reads those files only through
`verified_file`: confined to the record's directory, bounded, and equal to their entry.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from jgpt.foundation.paths import confined
from jgpt.foundation.validation import is_integer

RECORD_FILE_LIMIT = 1 << 28  # bytes of one file a record names: far above any lab's, far below a machine's memory


def dumps(value: Any) -> bytes:
    """The canonical bytes of a document a lab run writes: the bytes a replay must rebuild."""
    return (json.dumps(value, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode()


def file_entry(name: str, data: bytes) -> dict[str, Any]:
    return {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def verified_file(directory: Path, entry: Any, field: str) -> bytes:
    """The bytes of the file a record's entry names, checked before use."""
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("sha256"), str)
        or not is_integer(entry.get("bytes"))
        or not 0 <= entry["bytes"] <= RECORD_FILE_LIMIT
        or set(entry) - {"path", "sha256", "bytes", "id"}
    ):
        raise ApiError(field, f"must be a file entry {{path, sha256, bytes}} of at most {RECORD_FILE_LIMIT} bytes")
    path = confined(directory, entry.get("path"), f"{field}.path")
    if path.is_file() and path.stat().st_size != entry["bytes"]:  # refused before a byte is read
        raise ApiError(field, f"{entry['path']} does not have the size the record names")
    data = read_bytes(path, field)
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ApiError(field, f"{entry['path']} does not have the SHA-256 the record names")
    return data


def named_paths(value: Any) -> list[str]:
    """Every file entry's `path` in a record (recordings, cache runs, measured runs, calibration runs)."""
    if isinstance(value, dict):
        own = [value["path"]] if isinstance(value.get("path"), str) else []
        return own + [path for child in value.values() for path in named_paths(child)]
    return [path for child in value for path in named_paths(child)] if isinstance(value, list) else []
