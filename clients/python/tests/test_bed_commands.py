"""Listing, the with block, watched readiness and commands (streamed, background, killed, timed
out, fed stdin) on the real bed: real containers on the real node, through the exec API."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import AGENT_TEMPLATE, Bed

from sandboxrun import AsyncSandboxes, FileEvent, Sandbox, SandboxError, Timeout

pytestmark = pytest.mark.bed


def _running(b: Bed, sandbox: Sandbox) -> None:
    try:
        sandbox.wait_running(timeout=120)
    except Exception as e:
        raise AssertionError(f"{sandbox} did not run: {e}{b.diagnose()}") from e


def test_sandboxes_are_listed_by_template_labels_and_phase_and_a_with_block_stops_them(good: Bed) -> None:
    labels = {"agent": "lister"}
    with good.sandboxes.create(template=AGENT_TEMPLATE, generate_name="listed-", labels=labels) as sandbox:
        _running(good, sandbox)
        mine = good.sandboxes.list(labels=labels)
        assert [s.name for s in mine] == [sandbox.name]
        assert [s.name for s in good.sandboxes.list(template=AGENT_TEMPLATE, labels=labels, phase="Running")] == [
            sandbox.name
        ]
        assert good.sandboxes.list(labels=labels, phase="Stopped") == []
        assert good.sandboxes.list(template="no-such-template", labels=labels) == []
        assert good.sandboxes.get(sandbox.name).template == AGENT_TEMPLATE
    drained = sandbox.wait_drained(timeout=120)
    assert drained.status.phase == "Stopped", "leaving the with block stopped the sandbox"
    assert [s.name for s in good.sandboxes.list(labels=labels, phase="Stopped")] == [sandbox.name]


def test_commands_stream_run_in_the_background_are_killed_and_time_out(good: Bed) -> None:
    with good.sandboxes.create(template=AGENT_TEMPLATE, generate_name="commands-") as sandbox:
        _running(good, sandbox)
        chunks: list[str] = []
        errors: list[str] = []
        result = sandbox.run(
            "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo oops >&2",
            on_stdout=chunks.append,
            on_stderr=errors.append,
        )
        assert (result.exit_code, result.stdout, result.stderr) == (0, "line 1\nline 2\nline 3\n", "oops\n")
        assert "".join(chunks) == result.stdout and len(chunks) >= 2, "stdout arrived as it was written"
        assert "".join(errors) == "oops\n"

        fed = sandbox.run(["wc", "-c"], stdin=b"x" * 100_000)
        assert fed.stdout.strip() == "100000"

        seen: list[str] = []
        handle = sandbox.start(["sh", "-c", "echo started; sleep 300"], on_stdout=seen.append)
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen == ["started\n"] and handle.running and handle.pid
        assert str(handle.pid) in sandbox.run("ps -o pid,args").stdout
        began = time.monotonic()
        handle.kill("TERM")
        ended = handle.wait(timeout=30)
        assert ended.exit_code != 0 and time.monotonic() - began < 30, ended
        assert "sleep 300" not in sandbox.run("ps -o args").stdout, "the killed command is gone"

        with pytest.raises(Timeout):
            sandbox.run(["sleep", "400"], timeout=2)
        assert "sleep 400" not in sandbox.run("ps -o args").stdout, "a timed-out command does not outlive it"


def test_the_async_client_drives_a_sandbox_with_output_streamed_on_the_loop(good: Bed) -> None:
    aio = AsyncSandboxes(sync=good.sandboxes)

    async def main() -> tuple[list[str], str, list[str]]:
        async with await aio.create(template=AGENT_TEMPLATE, generate_name="async-", labels={"agent": "aio"}) as sb:
            await sb.wait_running(timeout=120)
            loop_thread = threading.get_ident()
            threads: set[int] = set()
            seen: list[str] = []

            def on_out(text: str) -> None:
                threads.add(threading.get_ident())
                seen.append(text)

            script = "echo one; sleep 0.3; echo two > /work/out/two.txt; cat /work/out/two.txt"
            result = await sb.run(script, on_stdout=on_out)
            assert threads == {loop_thread}, "callbacks run on the event loop"
            handle = await sb.start(["sleep", "300"])
            await handle.kill("TERM")
            killed = await handle.wait(timeout=30)
            assert killed.exit_code != 0
            listed = [s.name for s in await aio.list(labels={"agent": "aio"}, phase="Running")]
        files = await sb.wait_drained(timeout=120)
        return listed, result.stdout, [f.container_path for f in files.files()]

    listed, stdout, stored = asyncio.run(main())
    assert len(listed) == 1 and stdout == "one\ntwo\n" and stored == ["/work/out/two.txt"]


def test_files_in_a_running_sandbox_are_listed_watched_deleted_and_read_with_a_bound(good: Bed) -> None:
    with good.sandboxes.create(template=AGENT_TEMPLATE, generate_name="files-") as sandbox:
        _running(good, sandbox)
        sandbox.run(["sh", "-c", 'mkdir /work/out/sub && printf abc > "/work/out/odd\nname" && ln -s /etc/passwd /work/out/ln'])
        listed = {e.name: (e.type, e.size) for e in sandbox.list_files("/work/out")}
        assert listed == {"odd\nname": ("file", 3), "sub": ("directory", listed["sub"][1]), "ln": ("symlink", 11)}, listed

        with pytest.raises(SandboxError):
            sandbox.read_file("/work/out/odd\nname", max_bytes=2)
        assert sandbox.read_file("/work/out/odd\nname", max_bytes=3) == b"abc"
        cut = sandbox.run(["sh", "-c", "yes | head -c 100000"], max_output=10)
        assert (cut.stdout, cut.stdout_truncated) == ("y\ny\ny\ny\ny\n", True)

        events = sandbox.watch("/work/out", interval=0.3)
        sandbox.write_file("/work/out/new.txt", "new\n")
        first = next(events)
        assert (first.kind, first.entry.name, first.entry.size) == ("created", "new.txt", 4)
        sandbox.delete_file("/work/out/sub", recursive=True)
        sandbox.delete_file("/work/out/ln")
        sandbox.delete_file("/work/out/never-there")
        assert sandbox.run(["cat", "/etc/passwd"]).ok, "deleting a symlink left its target alone"
        gone = sorted(e.entry.name for e in next_events(events, 2))
        assert gone == ["ln", "sub"]
        assert {e.name for e in sandbox.list_files("/work/out")} == {"odd\nname", "new.txt"}

        saved = sandbox.checkpoint("files-c1", timeout=120)
        assert {f.path for f in saved.files()} == {"odd\nname", "new.txt"}
        sandbox.write_file("/work/out/later.txt", "later\n")
        again = sandbox.files(checkpoint=1)
        assert {f.path for f in again.files()} == {"odd\nname", "new.txt"}, "checkpoint 1 as it was saved"
        by_name = {f.path: f for f in again.files()}
        assert again.fetch(by_name["new.txt"], max_bytes=2) == b"ne"
    drained = sandbox.wait_drained(timeout=120)
    assert {f.path for f in drained.files()} == {"odd\nname", "new.txt", "later.txt"}
    assert {f.path for f in sandbox.files(attempt=1).files()} == {"odd\nname", "new.txt", "later.txt"}


def next_events(events: Iterator[FileEvent], n: int) -> list[FileEvent]:
    """The next ``n`` deleted events (watching may see other changes between two listings)."""
    seen: list[FileEvent] = []
    for event in events:
        if event.kind == "deleted":
            seen.append(event)
        if len(seen) == n:
            return seen
    return seen


def test_the_async_client_lists_and_watches_on_the_loop(good: Bed) -> None:
    async def drive() -> list[tuple[str, str]]:
        sandboxes = AsyncSandboxes(sync=good.sandboxes)
        async with await sandboxes.create(template=AGENT_TEMPLATE, generate_name="afiles-") as sandbox:
            await asyncio.to_thread(_running, good, sandbox.sync)
            await sandbox.write_file("/work/out/a.txt", "a")
            assert [e.name for e in await sandbox.list_files("/work/out")] == ["a.txt"]
            events = await sandbox.watch("/work/out", interval=0.3, timeout=60)
            await sandbox.delete_file("/work/out/a.txt")
            await sandbox.write_file("/work/out/b.txt", "b")
            seen: list[tuple[str, str]] = []
            async for event in events:
                seen.append((event.kind, event.entry.name))
                if ("deleted", "a.txt") in seen and ("created", "b.txt") in seen:
                    break
            return seen

    seen = asyncio.run(drive())
    assert ("deleted", "a.txt") in seen and ("created", "b.txt") in seen, seen
