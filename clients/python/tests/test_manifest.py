"""Manifests as the operator writes them are parsed; anything else is a StoreError."""

import json

import pytest
from helpers import manifest_doc, manifest_json

from sandboxrun import StoreError, parse_manifest


def test_a_manifest_names_its_archive_and_members() -> None:
    raw = manifest_json({"a.txt": b"hello", "d/b.bin": b"\x00\x01"}, "p/ns/job/u-1/00-work-out.tar.zst", "zstd")
    m = parse_manifest(raw)
    assert m.archive_key == "p/ns/job/u-1/00-work-out.tar.zst"
    assert m.compression == "zstd"
    assert (m.namespace, m.run, m.uid, m.declared_path, m.index) == ("ns", "job", "u-1", "/work/out", 0)
    assert [(f.path, f.size) for f in m.files] == [("a.txt", 5), ("d/b.bin", 2)]
    assert m.files[0].sha256 == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"


def test_directories_symlinks_and_superseded_members_are_not_files() -> None:
    doc = manifest_doc({"a.txt": b"1"}, "k.tar")
    doc["members"] += [
        {"path": "d", "kind": "dir", "size": 0, "mode": 0o755},
        {"path": "l", "kind": "symlink", "size": 0, "mode": 0o777, "linkTarget": "a.txt"},
        {"path": "old", "kind": "file", "size": 1, "mode": 0o644, "superseded": True},
    ]
    m = parse_manifest(doc)
    assert [f.path for f in m.files] == ["a.txt"]
    assert m.members[2].link_target == "a.txt"


def test_an_empty_path_has_a_manifest_without_members() -> None:
    m = parse_manifest(manifest_json({}, "k.tar", phase="Empty"))
    assert m.phase == "Empty" and m.files == []


@pytest.mark.parametrize(
    "change",
    [
        {"schemaVersion": 2},
        {"compression": "brotli"},
        {"archiveKey": None, "run": None},
    ],
)
def test_what_is_not_a_manifest_this_client_reads_is_refused(change: dict) -> None:
    doc = manifest_doc({"a": b"1"}, "k.tar")
    doc.update(change)
    with pytest.raises(StoreError):
        parse_manifest(json.dumps(doc))


def test_an_unknown_member_kind_is_refused() -> None:
    doc = manifest_doc({"a": b"1"}, "k.tar")
    doc["members"][0]["kind"] = "fifo"
    with pytest.raises(StoreError, match="unknown kind"):
        parse_manifest(doc)


def test_garbage_is_refused() -> None:
    with pytest.raises(StoreError):
        parse_manifest(b"<html>not json</html>")
