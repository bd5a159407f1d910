"""Small builders for the unit tests: tar archives and manifests made in memory."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import Any

import zstandard


def tar_of(entries: list[tuple[str, bytes | None, str | None]], compression: str = "none") -> bytes:
    """A tar of (name, content, symlink target): content for a file, a target for a symlink,
    neither for a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content, target in entries:
            info = tarfile.TarInfo(name)
            if target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            elif content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o640
                tar.addfile(info, io.BytesIO(content))
    raw = buf.getvalue()
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(raw)
    if compression == "gzip":
        import gzip

        return gzip.compress(raw)
    return raw


def manifest_doc(
    files: dict[str, bytes], archive_key: str, compression: str = "none", phase: str = "Drained"
) -> dict[str, Any]:
    """A manifest as the operator writes it (src/store/manifest.rs), for ``files``."""
    return {
        "schemaVersion": 1,
        "run": {"namespace": "ns", "name": "job", "uid": "u-1"},
        "declaredPath": "/work/out",
        "index": 0,
        "archiveKey": archive_key,
        "compression": compression,
        "capBytes": 1 << 20,
        "attempt": 1,
        "startedAt": "2026-12-04T00:00:00Z",
        "finishedAt": "2026-12-04T00:00:01Z",
        "phase": phase,
        "totals": {
            "members": len(files),
            "bytes": sum(map(len, files.values())),
            "droppedMembers": 0,
            "droppedBytes": 0,
            "rejectedMembers": 0,
            "inputBytes": 0,
            "archiveBytes": 0,
        },
        "members": [
            {
                "path": name,
                "kind": "file",
                "size": len(content),
                "sha256": hashlib.sha256(content).hexdigest(),
                "mode": 0o640,
            }
            for name, content in files.items()
        ],
        "dropped": [],
        "rejected": [],
    }


def manifest_json(*args: Any, **kwargs: Any) -> bytes:
    return json.dumps(manifest_doc(*args, **kwargs)).encode()
