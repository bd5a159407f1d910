"""The manifest the operator commits for each drained path (``NN-<slug>.manifest.json``): what
the archive holds, member by member, and which archive key it commits."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import StoreError

#: The manifest layout this client reads (``schemaVersion``).
SCHEMA_VERSION = 1
#: Archive compression → the extension of its key.
EXTENSIONS = {"none": "tar", "gzip": "tar.gz", "zstd": "tar.zst"}


@dataclass(frozen=True)
class Member:
    """One stored member: ``kind`` is ``file``, ``dir`` or ``symlink``; ``path`` is relative."""

    path: str
    kind: str
    size: int = 0
    sha256: str | None = None
    mode: int = 0o644
    link_target: str | None = None
    superseded: bool = False


@dataclass(frozen=True)
class Manifest:
    """A committed path: ``phase`` is ``Drained``, ``Empty`` or ``Capped``."""

    declared_path: str
    index: int
    archive_key: str
    compression: str
    phase: str
    namespace: str
    run: str
    uid: str
    members: list[Member] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[Member]:
        """The regular files as extraction leaves them (a superseded member is replaced)."""
        return [m for m in self.members if m.kind == "file" and not m.superseded]


def _member(entry: Mapping[str, Any]) -> Member:
    kind = str(entry["kind"])
    if kind not in ("file", "dir", "symlink"):
        raise StoreError(f"manifest member {entry.get('path')!r} has an unknown kind {kind!r}")
    return Member(
        path=str(entry["path"]),
        kind=kind,
        size=int(entry.get("size", 0)),
        sha256=entry.get("sha256"),
        mode=int(entry.get("mode", 0o644)),
        link_target=entry.get("linkTarget"),
        superseded=bool(entry.get("superseded", False)),
    )


def parse_manifest(raw: bytes | str | Mapping[str, Any]) -> Manifest:
    """Parses a manifest (its JSON text or the decoded object). Raises :class:`StoreError` when
    it is not one this client can read."""
    try:
        doc = json.loads(raw) if isinstance(raw, (bytes, str)) else dict(raw)
        version = int(doc.get("schemaVersion", 0))
        if version != SCHEMA_VERSION:
            raise StoreError(f"manifest schemaVersion {version} (this client reads {SCHEMA_VERSION})")
        compression = str(doc["compression"])
        if compression not in EXTENSIONS:
            raise StoreError(f"manifest compression {compression!r} is unknown")
        run = doc["run"]
        return Manifest(
            declared_path=str(doc["declaredPath"]),
            index=int(doc["index"]),
            archive_key=str(doc["archiveKey"]),
            compression=compression,
            phase=str(doc["phase"]),
            namespace=str(run["namespace"]),
            run=str(run["name"]),
            uid=str(run["uid"]),
            members=[_member(m) for m in doc.get("members", [])],
            dropped=[str(d["path"]) for d in doc.get("dropped", [])],
            rejected=[str(r["path"]) for r in doc.get("rejected", [])],
            changed=[str(c["path"]) for c in doc.get("changed", [])],
        )
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(f"not a SandboxRun manifest: {e!r}") from e
