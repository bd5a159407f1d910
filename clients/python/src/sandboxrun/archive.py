"""Reading a drained archive (tar, tar.gz, tar.zst) safely: the archive is the workload's output,
so it is untrusted. Nothing is ever written outside the destination directory: absolute names,
``..`` components, links pointing out, hard links and special files are refused, and no write
goes through a symlink."""

from __future__ import annotations

import gzip
import hashlib
import os
import posixpath
import stat
import tarfile
from pathlib import Path
from typing import IO

import zstandard

from .errors import UnsafeArchive
from .manifest import Manifest

_CHUNK = 1 << 16


def open_tar_stream(raw: IO[bytes], compression: str) -> tarfile.TarFile:
    """A streaming tar reader over ``raw`` decompressed as ``compression`` (none|gzip|zstd)."""
    if compression == "none":
        stream: IO[bytes] = raw
    elif compression == "gzip":
        stream = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
    elif compression == "zstd":
        stream = zstandard.ZstdDecompressor().stream_reader(raw)  # type: ignore[assignment]
    else:
        raise UnsafeArchive(f"unknown compression {compression!r}")
    return tarfile.open(fileobj=stream, mode="r|")


def safe_member_name(name: str) -> str:
    """The member's normalized relative path, or :class:`UnsafeArchive` when it is absolute,
    empty or climbs out with ``..``."""
    if name.startswith("/") or "\\" in name or "\x00" in name:
        raise UnsafeArchive(f"member {name!r} has an absolute or unsafe name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise UnsafeArchive(f"member {name!r} leaves the extraction directory")
    return "/".join(parts)


def safe_link_target(member: str, target: str) -> str:
    """A symlink's target when it stays inside the archive, else :class:`UnsafeArchive`."""
    if target.startswith("/"):
        raise UnsafeArchive(f"symlink {member!r} points to the absolute path {target!r}")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(member), target))
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeArchive(f"symlink {member!r} points outside the archive ({target!r})")
    return target


def _no_symlink_on_the_way(root: Path, rel: str) -> Path:
    """``root/rel`` after checking that no existing component below ``root`` is a symlink (an
    earlier member could have planted one to redirect a later write)."""
    current = root
    for part in rel.split("/")[:-1]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise UnsafeArchive(f"member {rel!r} would be written through {current}, not a directory")
    target = root / rel
    if target.is_symlink():
        raise UnsafeArchive(f"member {rel!r} would be written through the symlink {target}")
    return target


def _write_file(src: IO[bytes], dest: Path, mode: int) -> str:
    """Copies ``src`` into a new ``dest`` (never following a link); returns its hex sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        dest.unlink()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    digest = hashlib.sha256()
    with os.fdopen(fd, "wb") as out:
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
    os.chmod(dest, mode & 0o777)
    return digest.hexdigest()


def extract(tar: tarfile.TarFile, dest: Path, manifest: Manifest | None = None) -> int:
    """Extracts every member of ``tar`` under ``dest``; with ``manifest``, each file's sha256
    must match its record. Returns the number of members written."""
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    expected: dict[str, str] = {}
    if manifest is not None:
        expected = {m.path: m.sha256 for m in manifest.members if m.kind == "file" and m.sha256}
    written = 0
    for info in tar:
        rel = safe_member_name(info.name)
        target = _no_symlink_on_the_way(root, rel)
        if info.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif info.isreg():
            src = tar.extractfile(info)
            assert src is not None
            digest = _write_file(src, target, info.mode)
            want = expected.get(rel)
            if want is not None and want != digest:
                raise UnsafeArchive(f"{rel}: sha256 {digest} differs from the manifest's {want}")
        elif info.issym():
            safe_link_target(rel, info.linkname)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                target.unlink()
            os.symlink(info.linkname, target)
        else:
            raise UnsafeArchive(f"member {rel!r} is a {'hard link' if info.islnk() else 'special file'}: refused")
        written += 1
    return written


def read_file(tar: tarfile.TarFile, path: str) -> bytes | None:
    """The content of ``path`` in ``tar`` (its last version, as extraction would leave it); the
    other members are skipped, not read into memory."""
    wanted = safe_member_name(path)
    found: bytes | None = None
    for info in tar:
        if info.isreg() and safe_member_name(info.name) == wanted:
            src = tar.extractfile(info)
            assert src is not None
            found = src.read()
    return found
