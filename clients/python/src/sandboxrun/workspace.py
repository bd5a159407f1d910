"""Files inside a running sandbox: list a directory, delete, and watch a directory for changes
(docs/user-guide.md "Sandboxes for agents: from Python"). Each is a command in the workload
container (the image needs ``sh`` and ``stat``, as busybox and coreutils have), parsed here: the
workload chooses its files' names, so the listing is NUL-separated and a name may hold any byte
but NUL; its size is bounded (:data:`MAX_LISTING_BYTES`) so a directory of millions of entries
cannot fill the client's memory.

And which saved generation of a run to read back: the teardown's, an earlier attempt's or a
checkpoint's (:func:`generation_status`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import SandboxError

#: The most bytes of listing read from one directory (about 100,000 entries).
MAX_LISTING_BYTES = 8 * 1024 * 1024

#: ``sh -c LIST_SCRIPT sh DIR``: for each entry of DIR (dot files too, never ``.``/``..``), the
#: line ``<type>|<size>|<mtime>|<octal mode>`` from ``stat`` (of the entry itself: a symlink is
#: listed as one, never followed), then the entry's name and a NUL. Exit 3: DIR is not a
#: directory one can enter.
LIST_SCRIPT = (
    'cd -- "$1" 2>/dev/null || { echo "not a directory: $1" >&2; exit 3; }; '
    "for f in * .*; do "
    'case "$f" in .|..) continue;; esac; '
    '{ [ -e "$f" ] || [ -L "$f" ]; } || continue; '
    'stat -c "%F|%s|%Y|%a" -- "$f" || exit 4; '
    'printf "%s\\0" "$f"; '
    "done"
)

#: The ``stat`` file types, as the listing names them.
_TYPES = {
    "regular file": "file",
    "regular empty file": "file",
    "directory": "directory",
    "symbolic link": "symlink",
    "fifo": "fifo",
    "socket": "socket",
    "character special file": "device",
    "block special file": "device",
}


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory in the sandbox. ``type``: ``file``, ``directory``, ``symlink``,
    ``fifo``, ``socket``, ``device`` or ``other``; ``mtime`` in seconds since the epoch;
    ``mode`` the permission bits."""

    name: str
    path: str
    type: str
    size: int
    mtime: int
    mode: int


@dataclass(frozen=True)
class FileEvent:
    """A change seen by :meth:`sandboxrun.Sandbox.watch`: ``kind`` is ``created``, ``modified``
    (size, time, type or mode changed) or ``deleted`` (``entry`` is then the last one seen)."""

    kind: str
    entry: FileEntry


def parse_listing(directory: str, raw: bytes) -> list[FileEntry]:
    """The entries :data:`LIST_SCRIPT` printed for ``directory``, sorted by name. Anything but
    its own format is :class:`SandboxError` (never a shorter list)."""
    entries: list[FileEntry] = []
    rest = raw
    while rest:
        meta, sep, rest = rest.partition(b"\n")
        name, nul, after = rest.partition(b"\0")
        if not sep or not nul:
            raise SandboxError(f"the listing of {directory} is cut or not a listing")
        rest = after
        entries.append(_entry(directory, meta, name))
    return sorted(entries, key=lambda e: e.name)


def _entry(directory: str, meta: bytes, raw_name: bytes) -> FileEntry:
    fields = meta.decode("utf-8", "replace").split("|")
    name = raw_name.decode("utf-8", "surrogateescape")
    if len(fields) != 4 or not name or "/" in name:
        raise SandboxError(f"the listing of {directory} has an entry that is not one: {meta!r}")
    kind, size, mtime, mode = fields
    try:
        numbers = int(size), int(mtime), int(mode, 8)
    except ValueError as e:
        raise SandboxError(f"the listing of {directory} has an entry that is not one: {meta!r}") from e
    path = directory.rstrip("/") + "/" + name if directory != "/" else "/" + name
    return FileEntry(name, path, _TYPES.get(kind, "other"), *numbers)


def changes(before: Mapping[str, FileEntry], after: Mapping[str, FileEntry]) -> list[FileEvent]:
    """What changed from one listing to the next (by name): created, modified, deleted."""
    events = [FileEvent("deleted", e) for n, e in sorted(before.items()) if n not in after]
    for name, entry in sorted(after.items()):
        old = before.get(name)
        if old is None:
            events.append(FileEvent("created", entry))
        elif (old.type, old.size, old.mtime, old.mode) != (entry.type, entry.size, entry.mtime, entry.mode):
            events.append(FileEvent("modified", entry))
    return events


def generation_status(
    name: str, status: Mapping[str, Any], attempt: int | None, checkpoint: int | None
) -> dict[str, Any]:
    """The part of a run's ``status`` that says where the files of one generation are: the
    teardown's (neither given), attempt ``attempt``'s (``status.attempts[]``, or the latest
    attempt's own ``readBack``) or checkpoint ``checkpoint``'s (``status.checkpoints[]``).
    A generation the status does not have, or a refused checkpoint, is :class:`SandboxError`."""
    if attempt is not None and checkpoint is not None:
        raise ValueError("name an attempt or a checkpoint, not both")
    phase = status.get("phase")
    if checkpoint is not None:
        entry = _indexed(status.get("checkpoints"), checkpoint)
        if entry is None:
            raise SandboxError(f"{name} has no checkpoint {checkpoint} in its status")
        if entry.get("message") and not entry.get("readBack"):
            raise SandboxError(f"{name}: checkpoint {checkpoint} was refused: {entry['message']}")
        # A checkpoint is settled once listed: its phase is the run's "ended" for the reader.
        return {"phase": "Succeeded", "readBack": entry.get("readBack") or []}
    if attempt is not None:
        entry = _indexed(status.get("attempts"), attempt)
        if entry is not None:
            return {"phase": "Failed", "readBack": entry.get("readBack") or []}
        if attempt != status.get("attempt", 1):
            raise SandboxError(f"{name} has no attempt {attempt} in its status")
    return {"phase": phase, "readBack": status.get("readBack") or []}


def _indexed(entries: Any, index: int) -> Mapping[str, Any] | None:
    return next((e for e in entries or [] if isinstance(e, Mapping) and e.get("index") == index), None)
