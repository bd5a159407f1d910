"""Error typing from a run's status: a failed drain is DrainFailed; an empty path is not an error."""

import pytest

from sandboxrun import DrainFailed, RunStatus
from sandboxrun.status import check_drain

DRAINED = {
    "path": "/work/out",
    "phase": "Drained",
    "bytes": 5,
    "members": 1,
    "object": "s3://b/p/ns/r/u/00-work-out.tar",
    "manifest": "s3://b/p/ns/r/u/00-work-out.manifest.json",
    "attempts": 1,
}
EMPTY = {
    "path": "/work/empty",
    "phase": "Empty",
    "object": "s3://b/p/ns/r/u/01-work-empty.tar",
    "manifest": "s3://b/p/ns/r/u/01-work-empty.manifest.json",
    "attempts": 1,
}
FAILED = {"path": "/work/logs", "phase": "Failed", "attempts": 1, "message": "the store s3://b/p: access denied"}


def _status(*paths: dict, phase: str = "Stopped") -> RunStatus:
    return RunStatus.from_dict(
        {
            "phase": phase,
            "podName": "r-sbr",
            "readBack": list(paths),
            "conditions": [{"type": "Failed", "status": "True", "reason": "DrainFailed"}],
        }
    )


def test_an_empty_path_is_settled_and_not_an_error() -> None:
    status = _status(DRAINED, EMPTY)
    assert status.drain_settled
    assert check_drain("r", status) is status
    assert [p.phase for p in status.read_back] == ["Drained", "Empty"]
    assert status.read_back[1].stored


def test_a_failed_path_raises_drain_failed_with_its_path_and_message() -> None:
    with pytest.raises(DrainFailed) as raised:
        check_drain("r", _status(DRAINED, FAILED, EMPTY), event_note="1 of 3 path(s) failed")
    err = raised.value
    assert [(p.path, p.message) for p in err.failed] == [("/work/logs", "the store s3://b/p: access denied")]
    assert err.event_note == "1 of 3 path(s) failed"
    assert "access denied" in str(err)


def test_a_pending_path_is_not_settled() -> None:
    assert not _status({"path": "/a", "phase": "Pending"}).drain_settled
    assert not _status(DRAINED, phase="Draining").drain_settled


def test_a_status_without_anything_is_pending() -> None:
    status = RunStatus.from_dict(None)
    assert status.phase == "Pending" and not status.final and status.read_back == []


def test_the_failure_reason_is_the_failed_conditions() -> None:
    assert _status(FAILED).failure_reason() == "DrainFailed"
