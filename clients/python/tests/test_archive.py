"""Safe extraction: an archive is the workload's output, untrusted. Nothing lands outside the
destination, whatever the archive says."""

import io
import os
from pathlib import Path

import pytest
from helpers import manifest_json, tar_of

from sandboxrun import UnsafeArchive, parse_manifest
from sandboxrun.archive import extract, open_tar_stream, read_file, safe_link_target, safe_member_name


def _extract(tmp_path: Path, entries: list, compression: str = "none", manifest=None) -> Path:
    dest = tmp_path / "out"
    extract(open_tar_stream(io.BytesIO(tar_of(entries, compression)), compression), dest, manifest)
    return dest


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_files_directories_and_inner_links_are_extracted(tmp_path: Path, compression: str) -> None:
    dest = _extract(tmp_path, [("d", None, None), ("d/a.txt", b"hello", None), ("link", None, "d/a.txt")], compression)
    assert (dest / "d/a.txt").read_bytes() == b"hello"
    assert os.readlink(dest / "link") == "d/a.txt"
    assert (dest / "d/a.txt").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/etc/evil", "..", "./../evil"])
def test_members_that_climb_out_or_are_absolute_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeArchive):
        _extract(tmp_path, [(name, b"x", None)])
    assert not (tmp_path / "evil").exists()
    assert not Path("/etc/evil").exists()


@pytest.mark.parametrize("target", ["../outside", "/etc/passwd", "d/../../outside"])
def test_symlinks_pointing_out_are_refused(tmp_path: Path, target: str) -> None:
    with pytest.raises(UnsafeArchive, match="points"):
        _extract(tmp_path, [("link", None, target)])


def test_nothing_is_written_through_a_symlink_an_earlier_member_planted(tmp_path: Path) -> None:
    # "d" -> "." is inside the archive, but "d/x" must still not be written through it.
    with pytest.raises(UnsafeArchive, match="through"):
        _extract(tmp_path, [("d", None, "."), ("d/x", b"x", None)])


def test_hard_links_and_devices_are_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    import tarfile

    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hard")
        info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"
        tar.addfile(info)
    buf.seek(0)
    with pytest.raises(UnsafeArchive, match="hard link"):
        extract(open_tar_stream(buf, "none"), tmp_path / "out")


def test_a_file_that_differs_from_its_manifest_record_is_refused(tmp_path: Path) -> None:
    manifest = parse_manifest(manifest_json({"a.txt": b"what the manifest says"}, "k.tar"))
    with pytest.raises(UnsafeArchive, match="sha256"):
        _extract(tmp_path, [("a.txt", b"tampered", None)], manifest=manifest)


def test_read_file_returns_the_last_version_of_a_member() -> None:
    raw = tar_of([("a.txt", b"first", None), ("b", b"b", None), ("a.txt", b"second", None)])
    assert read_file(open_tar_stream(io.BytesIO(raw), "none"), "a.txt") == b"second"
    assert read_file(open_tar_stream(io.BytesIO(raw), "none"), "missing") is None


def test_name_checks() -> None:
    assert safe_member_name("./a//b/") == "a/b"
    assert safe_link_target("d/l", "../a") == "../a"
    with pytest.raises(UnsafeArchive):
        safe_member_name("")
