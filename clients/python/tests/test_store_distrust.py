"""The client distrusts the store (docs/contract.md, "The Python client distrusts the store"):
whoever holds its credentials — the tenant, for a tenant store — can put anything there. Each
test forges a ``file://`` store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import manifest_doc, tar_of

from sandboxrun import RunFiles, StoreReader
from sandboxrun.archive import extract, open_tar_stream
from sandboxrun.errors import StoreError, UnsafeArchive
from sandboxrun.files import MAX_MANIFEST_BYTES
from sandboxrun.manifest import parse_manifest
from sandboxrun.status import RunStatus

RUN_DIR = "ns/job/u-1"


def _store(root: Path, doc: dict[str, Any], archive: bytes | None = None, run_dir: str = RUN_DIR) -> RunFiles:
    """A store under ``root`` with one path of run ``ns/job`` (uid ``u-1``) committed at
    ``run_dir``, and the RunFiles of that run."""
    directory = root / run_dir
    directory.mkdir(parents=True, exist_ok=True)
    if archive is not None:
        (directory / "00-work-out.tar").write_bytes(archive)
    (directory / "00-work-out.manifest.json").write_bytes(json.dumps(doc).encode())
    status = RunStatus.from_dict(
        {
            "phase": "Stopped",
            "readBack": [
                {
                    "path": "/work/out",
                    "phase": "Drained",
                    "object": f"file://{directory}/00-work-out.tar",
                    "manifest": f"file://{directory}/00-work-out.manifest.json",
                }
            ],
        }
    )
    return RunFiles("job", status, StoreReader(), namespace="ns", uid="u-1")


class _Bucket:
    """An S3 bucket in memory, answering ``get_object`` as boto3 does (the store is the
    tenant's: its objects are whatever it put)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        import io

        body = io.BytesIO(self.objects[Key])
        body._content_length = len(self.objects[Key])  # type: ignore[attr-defined]
        return {"Body": body}


def test_a_manifest_naming_another_runs_archive_is_refused(tmp_path: Path) -> None:
    victim = tar_of([("secret.txt", b"theirs", None)])
    doc = manifest_doc({"secret.txt": b"theirs"}, "ns/victim/u-9/00-work-out.tar")
    bucket = _Bucket(
        {
            "ns/victim/u-9/00-work-out.tar": victim,
            f"{RUN_DIR}/00-work-out.manifest.json": json.dumps(doc).encode(),
        }
    )
    status = RunStatus.from_dict(
        {
            "phase": "Stopped",
            "readBack": [
                {
                    "path": "/work/out",
                    "phase": "Drained",
                    "manifest": f"s3://b/{RUN_DIR}/00-work-out.manifest.json",
                }
            ],
        }
    )
    files = RunFiles("job", status, StoreReader(s3_client=bucket), namespace="ns", uid="u-1")
    with pytest.raises(StoreError, match="not its own archive|not beside it"):
        files.files()
    # On a file:// store too.
    other = tmp_path / "ns/victim/u-9"
    other.mkdir(parents=True)
    (other / "00-work-out.tar").write_bytes(victim)
    with pytest.raises(StoreError, match="not its own archive|not beside it"):
        _store(tmp_path, doc).paths()


def test_a_manifest_of_another_run_or_outside_the_runs_directory_is_refused(tmp_path: Path) -> None:
    archive = tar_of([("a.txt", b"x", None)])
    theirs = manifest_doc({"a.txt": b"x"}, f"{RUN_DIR}/00-work-out.tar")
    theirs["run"] = {"namespace": "ns", "name": "victim", "uid": "u-9"}
    with pytest.raises(StoreError, match="not\\s+ns/job"):
        _store(tmp_path / "a", theirs, archive).paths()
    ours = manifest_doc({"a.txt": b"x"}, "elsewhere/00-work-out.tar")
    with pytest.raises(StoreError, match="not in the directory of run"):
        _store(tmp_path / "b", ours, archive, run_dir="elsewhere").paths()
    # The run's own directory, and a later attempt's below it, are read.
    ok = manifest_doc({"a.txt": b"x"}, f"{RUN_DIR}/attempt-2/00-work-out.tar")
    assert [f.path for f in _store(tmp_path / "c", ok, archive, run_dir=f"{RUN_DIR}/attempt-2").files()] == ["a.txt"]


def test_a_manifest_larger_than_the_bound_is_refused_unread(tmp_path: Path) -> None:
    files = _store(tmp_path, manifest_doc({}, f"{RUN_DIR}/00-work-out.tar"))
    manifest = tmp_path / RUN_DIR / "00-work-out.manifest.json"
    with manifest.open("r+b") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no disk used
    with pytest.raises(StoreError, match="more than"):
        files.paths()
    with pytest.raises(StoreError, match="more than"):
        StoreReader().get(f"file://{manifest}", 1024)


def test_only_members_the_manifest_lists_are_extracted(tmp_path: Path) -> None:
    archive = tar_of([("listed.txt", b"ok", None), ("smuggled.sh", b"rm -rf ~", None)])
    files = _store(tmp_path, manifest_doc({"listed.txt": b"ok"}, f"{RUN_DIR}/00-work-out.tar"), archive)
    with pytest.raises(UnsafeArchive, match="not listed"):
        files.download(tmp_path / "dl")
    assert not (tmp_path / "dl/00-work-out/smuggled.sh").exists()
    # A member listed as a file that arrives as a symlink is not the member listed either.
    manifest = parse_manifest(manifest_doc({"link": b""}, f"{RUN_DIR}/00-work-out.tar"))
    with pytest.raises(UnsafeArchive, match="not listed"):
        extract(open_tar_stream(_bytes(tar_of([("link", None, "target")])), "none"), tmp_path / "x", manifest)


def test_a_link_that_climbs_out_through_another_link_is_resolved_for_real(tmp_path: Path) -> None:
    # Lexically `a/out -> up/..` stays in `a/`; on the disk `a/up` is `a/..` = the root, and
    # `a/out` is the root's parent.
    archive = tar_of([("a", None, None), ("a/out", None, "up/.."), ("a/up", None, "..")])
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchive, match="resolve outside"):
        extract(open_tar_stream(_bytes(archive), "none"), dest)
    assert not (dest / "a/out").is_symlink()
    assert (dest / "a/up").is_symlink()  # inside: kept


def _bytes(raw: bytes) -> Any:
    import io

    return io.BytesIO(raw)
