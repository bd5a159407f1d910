"""The lifecycle's waits and errors against a fake apiserver: what a status sequence raises."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

import sandboxrun.client as lifecycle
from sandboxrun import DrainFailed, RunFailed, SandboxError, Sandboxes, Timeout


class FakeWatchResponse:
    """The urllib3 response ``watch.Watch`` reads (``_preload_content=False``)."""

    status = 200

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.lines

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class FakeRuns:
    """The CustomObjectsApi calls the client makes, answered from a list of statuses."""

    def __init__(self, statuses: list[dict[str, Any]], items: list[dict[str, Any]] | None = None) -> None:
        self.statuses: Iterator[dict[str, Any]] = iter(statuses)
        self.last: dict[str, Any] = {}
        self.created: dict[str, Any] = {}
        self.patched: list[dict[str, Any]] = []
        self.gets = 0
        self.watches: list[dict[str, Any]] = []
        self.lists: list[dict[str, Any]] = []
        self.items = items or []

    def _obj(self, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "r", "namespace": "ns", "uid": "u-1"}, "status": status}

    def create_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, body: Any) -> Any:
        self.created = body
        return self._obj({})

    def get_namespaced_custom_object(self, *args: Any) -> Any:
        self.gets += 1
        self.last = next(self.statuses, self.last)
        return self._obj(self.last)

    def list_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        """A watch (``watch=True``) streams the statuses not read yet, one MODIFIED event each,
        as the apiserver does (JSON lines); a list answers ``items``, two per page."""
        if kwargs.get("watch"):
            self.watches.append(kwargs)
            events = []
            for status in self.statuses:
                self.last = status
                events.append(json.dumps({"type": "MODIFIED", "object": self._obj(status)}).encode() + b"\n")
            return FakeWatchResponse(events)
        self.lists.append(kwargs)
        start = int(kwargs.get("_continue") or 0)
        page = self.items[start : start + 2]
        more = str(start + 2) if start + 2 < len(self.items) else None
        return {"items": page, "metadata": {"continue": more} if more else {}}


    def patch_namespaced_custom_object(self, *args: Any) -> Any:
        self.patched.append(args[-1])
        return self._obj(self.last)


class FakeEvents:
    def list_namespaced_event(self, namespace: str, field_selector: str) -> Any:
        assert "reason=sandbox_runfiles_drain_failed" in field_selector
        event = SimpleNamespace(involved_object=SimpleNamespace(uid="u-1"), message="1 of 1 path(s) FAILED")
        return SimpleNamespace(items=[event])


def _sandboxes(
    monkeypatch: pytest.MonkeyPatch, statuses: list[dict[str, Any]], items: list[dict[str, Any]] | None = None
) -> tuple[Sandboxes, FakeRuns]:
    monkeypatch.setattr(lifecycle, "_POLL", 0.0)
    sandboxes = Sandboxes("ns", api_client=client.ApiClient())
    runs = FakeRuns(statuses, items)
    sandboxes._custom = runs  # type: ignore[assignment]
    sandboxes._core = FakeEvents()  # type: ignore[assignment]
    return sandboxes, runs


def test_create_from_a_template_sets_only_the_ref_and_open_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _sandboxes(monkeypatch, [])
    sandboxes.create(template="agent-tools", command=["sh"], env={"A": "1"})
    assert runs.created["spec"] == {
        "templateRef": {"name": "agent-tools", "kind": "SandboxRunTemplate"},
        "command": ["sh"],
        "env": [{"name": "A", "value": "1"}],
    }
    assert runs.created["metadata"] == {"generateName": "sandbox-"}


def test_wait_running_returns_once_the_pod_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, _ = _sandboxes(monkeypatch, [{}, {"phase": "Pending"}, {"phase": "Running", "podName": "r-sbr"}])
    assert sandboxes.create().wait_running(timeout=5).pod_name == "r-sbr"


def test_a_run_that_ends_before_running_raises_run_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    ended = {
        "phase": "Failed",
        "message": "image not found",
        "conditions": [{"type": "Failed", "status": "True", "reason": "ImagePullFailed"}],
    }
    sandboxes, _ = _sandboxes(monkeypatch, [{"phase": "Pending"}, ended])
    with pytest.raises(RunFailed) as raised:
        sandboxes.create().wait_running(timeout=5)
    assert (raised.value.reason, raised.value.message) == ("ImagePullFailed", "image not found")


def test_a_wait_that_runs_out_says_what_it_saw_last(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False", "reason": "Unschedulable", "message": "no node"}],
    }
    sandboxes, _ = _sandboxes(monkeypatch, [pending])
    with pytest.raises(Timeout) as raised:
        sandboxes.create().wait_running(timeout=0.05)
    assert "Unschedulable: no node" in raised.value.last


def test_wait_drained_raises_drain_failed_with_the_events_note(monkeypatch: pytest.MonkeyPatch) -> None:
    draining = {"phase": "Draining", "readBack": [{"path": "/out", "phase": "Pending"}]}
    failed = {"phase": "Stopped", "readBack": [{"path": "/out", "phase": "Failed", "message": "store refused"}]}
    sandboxes, runs = _sandboxes(monkeypatch, [{"phase": "Running", "podName": "r-sbr"}, draining, failed])
    sandbox = sandboxes.create()
    sandbox.stop()
    assert runs.patched == [{"spec": {"stop": True}}]
    with pytest.raises(DrainFailed) as raised:
        sandbox.wait_drained(timeout=5)
    assert [(p.path, p.message) for p in raised.value.failed] == [("/out", "store refused")]
    assert raised.value.event_note == "1 of 1 path(s) FAILED"


def test_wait_drained_of_an_empty_path_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = {"phase": "Stopped", "readBack": [{"path": "/out", "phase": "Empty"}]}
    sandboxes, _ = _sandboxes(monkeypatch, [empty])
    files = sandboxes.create().wait_drained(timeout=5)
    assert files.files() == [] and [p.phase for p in files.status.read_back] == ["Empty"]


def test_readiness_is_watched_not_polled(monkeypatch: pytest.MonkeyPatch) -> None:
    # One read, then one watch of this run's name from the version read: every later status
    # arrives as a watch event, none by reading the run again.
    statuses = [{}] + [{"phase": "Pending"}] * 20 + [{"phase": "Running", "podName": "r-sbr"}]
    sandboxes, runs = _sandboxes(monkeypatch, statuses)
    assert sandboxes.create().wait_running(timeout=5).pod_name == "r-sbr"
    assert runs.gets == 1, "the status is read once, then watched"
    (watched,) = runs.watches
    assert watched["field_selector"] == "metadata.name=r" and watched["timeout_seconds"] >= 1


def test_a_run_deleted_while_awaited_is_an_error_not_a_wait_to_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _sandboxes(monkeypatch, [{"phase": "Pending"}])
    gone = json.dumps({"type": "DELETED", "object": runs._obj({"phase": "Pending"})}).encode() + b"\n"
    runs.list_namespaced_custom_object = lambda *a, **k: FakeWatchResponse([gone])  # type: ignore[method-assign]
    with pytest.raises(SandboxError, match="deleted"):
        sandboxes.create().wait_running(timeout=30)


def _item(name: str, phase: str, template: str | None = None, kind: str = "SandboxRunTemplate") -> dict[str, Any]:
    spec = {"templateRef": {"name": template, "kind": kind}} if template else {}
    meta = {"name": name, "namespace": "ns", "uid": f"u-{name}", "labels": {"team": "a"}}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_list_filters_by_template_and_phase_across_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [
        _item("a", "Running", "agent-tools"),
        _item("b", "Stopped", "agent-tools"),
        _item("c", "Running", "other"),
        _item("d", "Running"),
        _item("e", "Pending", "agent-tools", kind="ClusterSandboxRunTemplate"),
    ]
    sandboxes, runs = _sandboxes(monkeypatch, [], items)
    assert [s.name for s in sandboxes.list()] == ["a", "b", "c", "d", "e"]
    assert len(runs.lists) == 3, "read page by page"
    assert [s.name for s in sandboxes.list(template="agent-tools")] == ["a", "b", "e"]
    running = sandboxes.list(template="agent-tools", phase=["Running", "Pending"], template_kind="SandboxRunTemplate")
    expected = [("a", "agent-tools", "Running", {"team": "a"})]
    assert [(s.name, s.template, s.phase, s.labels) for s in running] == expected


def test_list_by_labels_asks_the_apiserver_with_a_selector(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _sandboxes(monkeypatch, [], [_item("a", "Running")])
    sandboxes.list(labels={"team": "a", "example.com/agent": "x-1"})
    assert runs.lists[-1]["label_selector"] == "team=a,example.com/agent=x-1"


@pytest.mark.parametrize(
    "labels",
    [{"team": "a,team!=b"}, {"team": "a b"}, {"team,x": "a"}, {"a=b": "c"}, {"team": "a)"}, {"": "a"}],
)
def test_a_label_that_would_add_a_selector_term_is_refused(monkeypatch: pytest.MonkeyPatch, labels: Any) -> None:
    sandboxes, runs = _sandboxes(monkeypatch, [], [])
    with pytest.raises(ValueError):
        sandboxes.list(labels=labels)
    assert runs.lists == [], "nothing was asked"


def test_a_with_block_stops_the_sandbox_even_when_it_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _sandboxes(monkeypatch, [])
    with pytest.raises(RuntimeError):
        with sandboxes.create() as sandbox:
            assert sandbox.name == "r"
            raise RuntimeError("the agent broke")
    assert runs.patched == [{"spec": {"stop": True}}]
