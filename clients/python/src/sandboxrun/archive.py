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
from dataclasses import dataclass
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
        stream = zstandard.ZstdDecompressor().stream_reader(raw)
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


def _inside(root: Path, path: Path | str) -> bool:
    """Whether ``path``, resolved for real (every symlink on the disk followed), is ``root`` or
    below it."""
    real = os.path.realpath(path)
    return real == str(root) or real.startswith(str(root) + os.sep)


def _write_file(src: IO[bytes], dest: Path, mode: int, root: Path) -> str:
    """Copies ``src`` into a new ``dest`` (never following a link); returns its hex sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not _inside(root, dest.parent):
        raise UnsafeArchive(f"{dest} would be written outside {root}")
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


def _listed(manifest: Manifest | None) -> dict[str, tuple[str, str | None]] | None:
    """What the manifest lists, by path: (kind, sha256 or link target). None: no manifest."""
    if manifest is None:
        return None
    listed: dict[str, tuple[str, str | None]] = {}
    for m in manifest.members:
        listed[safe_member_name(m.path)] = (m.kind, m.sha256 if m.kind == "file" else m.link_target)
    return listed


def _check_listed(listed: dict[str, tuple[str, str | None]] | None, rel: str, kind: str) -> str | None:
    """The record of member ``rel`` of ``kind``: with a manifest, only a member it lists as that
    kind is extracted (the archive is the workload's; the manifest is what the operator
    checked). Returns the record's sha256 (file) or link target (symlink)."""
    if listed is None:
        return None
    record = listed.get(rel)
    if record is None or record[0] != kind:
        raise UnsafeArchive(f"member {rel!r} ({kind}) is not listed as such in the manifest: refused")
    return record[1]


def _links_stay_inside(root: Path, links: list[Path]) -> None:
    """Every symlink written resolves, for real, inside ``root`` (a lexical check cannot see
    a link that climbs through another link, e.g. ``a/up -> ..`` then ``a/out -> up/..``); one
    that does not is removed and refused."""
    escaping = [link for link in links if link.is_symlink() and not _inside(root, link)]
    for link in escaping:
        link.unlink()
    if escaping:
        names = ", ".join(str(link.relative_to(root)) for link in escaping)
        raise UnsafeArchive(f"symlink(s) {names} resolve outside {root}: removed and refused")


def extract(tar: tarfile.TarFile, dest: Path, manifest: Manifest | None = None) -> int:
    """Extracts every member of ``tar`` under ``dest``; with ``manifest``, only the members it
    lists (as the kind it lists them) and each file's sha256 must match its record. Returns the
    number of members written."""
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(dest))
    listed = _listed(manifest)
    links: list[Path] = []
    written = 0
    for info in tar:
        rel = safe_member_name(info.name)
        target = _no_symlink_on_the_way(root, rel)
        if info.isdir():
            _check_listed(listed, rel, "dir")
            target.mkdir(parents=True, exist_ok=True)
            if not _inside(root, target):
                raise UnsafeArchive(f"directory {rel!r} resolves outside {root}")
        elif info.isreg():
            want = _check_listed(listed, rel, "file")
            src = tar.extractfile(info)
            assert src is not None
            digest = _write_file(src, target, info.mode, root)
            if want is not None and want != digest:
                raise UnsafeArchive(f"{rel}: sha256 {digest} differs from the manifest's {want}")
        elif info.issym():
            want = _check_listed(listed, rel, "symlink")
            if listed is not None and want != info.linkname:
                raise UnsafeArchive(f"symlink {rel!r} points to {info.linkname!r}, the manifest says {want!r}")
            safe_link_target(rel, info.linkname)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                target.unlink()
            os.symlink(info.linkname, target)
            links.append(target)
        else:
            raise UnsafeArchive(f"member {rel!r} is a {'hard link' if info.islnk() else 'special file'}: refused")
        written += 1
    _links_stay_inside(root, links)
    return written


def read_file(tar: tarfile.TarFile, path: str) -> bytes | None:
    """The content of ``path`` in ``tar`` (its last version, as extraction would leave it); the
    other members are skipped, not read into memory."""
    found = read_member(tar, path)
    return None if found is None else found.head


@dataclass(frozen=True)
class MemberRead:
    """A member read through: its first bytes (all of them unless a ``keep`` bound cut it), the
    sha256 and size of the whole member."""

    head: bytes
    sha256: str
    size: int


def read_member(tar: tarfile.TarFile, path: str, keep: int | None = None) -> MemberRead | None:
    """``path`` in ``tar`` (its last version) read in chunks: the whole member is hashed, only its
    first ``keep`` bytes are kept (``None``: all), so a member of any size read with a bound costs
    a bounded amount of memory."""
    wanted = safe_member_name(path)
    found: MemberRead | None = None
    for info in tar:
        if info.isreg() and safe_member_name(info.name) == wanted:
            src = tar.extractfile(info)
            assert src is not None
            digest, head, size = hashlib.sha256(), bytearray(), 0
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                room = len(chunk) if keep is None else max(0, keep - len(head))
                head += chunk[:room]
            found = MemberRead(bytes(head), digest.hexdigest(), size)
    return found
