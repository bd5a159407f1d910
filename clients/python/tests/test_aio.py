"""The asyncio API against the same fake apiserver: the sync client's behaviour, awaited, with the
loop free while a wait or a command is pending (plain tests: ``asyncio.run``)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from test_lifecycle import FakeWatchResponse, _item, _sandboxes

from sandboxrun import AsyncSandboxes


def test_the_async_client_lists_waits_by_watch_and_stops_on_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _sandboxes(
        monkeypatch, [{}, {"phase": "Pending"}, {"phase": "Running", "podName": "r-sbr"}], [_item("a", "Running", "t")]
    )
    aio = AsyncSandboxes(sync=sandboxes)

    async def main() -> tuple[list[str], str | None]:
        listed = [s.name for s in await aio.list(template="t", phase="Running")]
        async with await aio.create(template="t") as sandbox:
            status = await sandbox.wait_running(timeout=5)
        return listed, status.pod_name

    assert asyncio.run(main()) == (["a"], "r-sbr")
    assert runs.gets == 1 and len(runs.watches) == 1, "watched, not polled"
    assert runs.patched == [{"spec": {"stop": True}}], "async with stopped it"


def test_a_pending_wait_leaves_the_event_loop_free(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _sandboxes(monkeypatch, [{"phase": "Pending"}])
    ticks: list[int] = []

    def slow_watch(*args: object, **kwargs: object) -> FakeWatchResponse:
        while not release_flag:  # the watch answers only once the loop has ticked five times
            time.sleep(0.01)
        running = {"type": "MODIFIED", "object": runs._obj({"phase": "Running", "podName": "r-sbr"})}
        return FakeWatchResponse([json.dumps(running).encode() + b"\n"])

    runs.list_namespaced_custom_object = slow_watch  # type: ignore[method-assign]
    release_flag = False

    async def main() -> str | None:
        nonlocal release_flag
        sandbox = await AsyncSandboxes(sync=sandboxes).get("r")
        waiting = asyncio.create_task(sandbox.wait_running(timeout=10))
        for i in range(5):
            await asyncio.sleep(0.01)
            ticks.append(i)
        release_flag = True
        return (await waiting).pod_name

    assert asyncio.run(main()) == "r-sbr"
    assert ticks == [0, 1, 2, 3, 4], "the loop ran while the wait was pending"
