"""Listing a directory in a sandbox (the workload chooses its names), watching it, bounded
reads, and which generation of a run's files is read back: without a cluster."""

from __future__ import annotations

import pytest

from sandboxrun import SandboxError
from sandboxrun.exec import _Sink
from sandboxrun.workspace import FileEntry, changes, generation_status, parse_listing


def _record(meta: str, name: bytes) -> bytes:
    return meta.encode() + b"\n" + name + b"\0"


def test_a_listing_keeps_names_with_newlines_bars_and_invalid_utf8_whole() -> None:
    raw = (
        _record("regular file|5|1700000000|644", b"a\nb|c")
        + _record("directory|4096|1700000001|755", b"sub")
        + _record("symbolic link|11|1700000002|777", b"\xff-link")
        + _record("regular empty file|0|1700000003|600", b".hidden")
    )
    entries = parse_listing("/work/out/", raw)
    assert [(e.name, e.type, e.size, e.mode) for e in entries] == [
        (".hidden", "file", 0, 0o600),
        ("a\nb|c", "file", 5, 0o644),
        ("sub", "directory", 4096, 0o755),
        ("\udcff-link", "symlink", 11, 0o777),
    ]
    assert entries[1].path == "/work/out/a\nb|c"
    assert parse_listing("/", _record("directory|1|2|755", b"etc"))[0].path == "/etc"


@pytest.mark.parametrize(
    "raw",
    [
        b"regular file|5|1700000000|644\nname-without-its-nul",
        b"regular file|5|1700000000\nname\0",
        b"regular file|five|1700000000|644\nname\0",
        b"regular file|5|1700000000|644\na/b\0",
        b"regular file|5|1700000000|644\n\0",
    ],
)
def test_anything_but_a_listing_is_an_error_never_a_shorter_list(raw: bytes) -> None:
    with pytest.raises(SandboxError):
        parse_listing("/d", raw)


def _e(name: str, size: int = 1, mtime: int = 1, kind: str = "file") -> FileEntry:
    return FileEntry(name, "/d/" + name, kind, size, mtime, 0o644)


def test_changes_between_two_listings_are_created_modified_and_deleted() -> None:
    before = {"kept": _e("kept"), "grown": _e("grown"), "gone": _e("gone"), "swapped": _e("swapped")}
    after = {
        "kept": _e("kept"),
        "grown": _e("grown", size=2),
        "swapped": _e("swapped", kind="symlink"),
        "new": _e("new"),
    }
    assert [(c.kind, c.entry.name) for c in changes(before, after)] == [
        ("deleted", "gone"),
        ("modified", "grown"),
        ("created", "new"),
        ("modified", "swapped"),
    ]
    assert changes(after, after) == []


def test_the_result_keeps_only_max_output_bytes_and_says_so_while_the_callback_sees_all() -> None:
    seen: list[str] = []
    sink = _Sink(seen.append, limit=4)
    sink.feed(b"abc")
    sink.feed(b"defgh")
    sink.feed(b"", final=True)
    assert (bytes(sink.data), sink.truncated, sink.seen) == (b"abcd", True, 8)
    assert "".join(seen) == "abcdefgh"
    whole = _Sink(None)
    whole.feed(b"x" * 10)
    assert (len(whole.data), whole.truncated) == (10, False)


STATUS = {
    "phase": "Stopped",
    "attempt": 3,
    "readBack": [{"path": "/out", "phase": "Drained", "manifest": "file:///s/ns/r/u/00-out.manifest.json"}],
    "attempts": [
        {"index": 1, "readBack": [{"path": "/out", "phase": "Drained", "manifest": "a1"}]},
        {"index": 2, "readBack": [{"path": "/out", "phase": "Failed", "message": "store down"}]},
    ],
    "checkpoints": [
        {"index": 1, "token": "t1", "readBack": [{"path": "/out", "phase": "Drained", "manifest": "c1"}]},
        {"index": 2, "token": "t2", "message": "past --max-checkpoints"},
    ],
}


def test_a_generation_is_the_teardowns_an_attempts_or_a_checkpoints() -> None:
    assert generation_status("r", STATUS, None, None)["readBack"] == STATUS["readBack"]
    assert generation_status("r", STATUS, 1, None)["readBack"][0]["manifest"] == "a1"
    assert generation_status("r", STATUS, 3, None)["readBack"] == STATUS["readBack"], "the latest attempt's"
    assert generation_status("r", STATUS, None, 1)["readBack"][0]["manifest"] == "c1"
    assert generation_status("r", STATUS, 2, None)["readBack"][0]["phase"] == "Failed"


@pytest.mark.parametrize(("attempt", "checkpoint"), [(7, None), (None, 9), (None, 2)])
def test_a_generation_the_status_lacks_or_a_refused_checkpoint_is_an_error(
    attempt: int | None, checkpoint: int | None
) -> None:
    with pytest.raises(SandboxError):
        generation_status("r", STATUS, attempt, checkpoint)
