"""The same API for asyncio: :class:`AsyncSandboxes` and :class:`AsyncSandbox` run the sync
client's calls in threads (``asyncio.to_thread``), so a wait or a command never blocks the event
loop.

Why a wrapper rather than ``kubernetes_asyncio``: that package is a separate generated client
(its own release line, behind the official one), and exec is where this client's care lives
(the error channel's exit code, stdin counted in the pod instead of closed, the pid line a kill
names); one implementation of it is tested on the bed, not two. The waits already watch rather
than poll, so a thread per pending wait is all the wrapper costs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from .client import Sandbox, Sandboxes
from .exec import ExecResult, Execution, Output
from .files import RunFiles
from .status import RunStatus
from .workspace import FileEntry, FileEvent, changes


def _on_loop(callback: Output | None) -> Output | None:
    """``callback`` called on the running event loop (the output arrives on a reader thread)."""
    if callback is None:
        return None
    loop = asyncio.get_running_loop()
    return lambda text: loop.call_soon_threadsafe(callback, text)


class AsyncExecution:
    """A background command (:meth:`AsyncSandbox.start`): ``await wait()``, ``await kill()``."""

    def __init__(self, execution: Execution) -> None:
        self.execution = execution

    @property
    def pid(self) -> int | None:
        return self.execution.pid

    @property
    def running(self) -> bool:
        return self.execution.running

    async def wait(self, timeout: float | None = None) -> ExecResult:
        return await asyncio.to_thread(self.execution.wait, timeout)

    async def kill(self, signal: str = "KILL") -> None:
        await asyncio.to_thread(self.execution.kill, signal)


class AsyncSandbox:
    """:class:`~sandboxrun.Sandbox` for asyncio; ``async with`` stops it on exit."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        self.name, self.namespace = sandbox.name, sandbox.namespace
        self.labels, self.template, self.phase = sandbox.labels, sandbox.template, sandbox.phase

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.namespace}/{self.name})"

    async def __aenter__(self) -> AsyncSandbox:
        """``async with``: the sandbox is stopped when the block ends, also when it raises."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def status(self) -> RunStatus:
        return await asyncio.to_thread(self.sync.status)

    async def wait_running(self, timeout: float = 300.0) -> RunStatus:
        return await asyncio.to_thread(self.sync.wait_running, timeout)

    async def pause(self, wait: bool = True, timeout: float = 600.0) -> RunStatus:
        """As :meth:`Sandbox.pause`."""
        return await asyncio.to_thread(self.sync.pause, wait, timeout)

    async def resume(self, wait: bool = True, timeout: float = 300.0) -> RunStatus:
        """As :meth:`Sandbox.resume`."""
        return await asyncio.to_thread(self.sync.resume, wait, timeout)

    async def run(
        self,
        cmd: str | Sequence[str],
        stdin: bytes | None = None,
        timeout: float = 300.0,
        on_stdout: Output | None = None,
        on_stderr: Output | None = None,
        max_output: int | None = None,
    ) -> ExecResult:
        """As :meth:`Sandbox.run`; the callbacks are called on the event loop."""
        out, err = _on_loop(on_stdout), _on_loop(on_stderr)
        return await asyncio.to_thread(self.sync.run, cmd, stdin, timeout, out, err, max_output)

    async def start(
        self,
        cmd: str | Sequence[str],
        stdin: bytes | None = None,
        on_stdout: Output | None = None,
        on_stderr: Output | None = None,
        max_output: int | None = None,
    ) -> AsyncExecution:
        out, err = _on_loop(on_stdout), _on_loop(on_stderr)
        return AsyncExecution(await asyncio.to_thread(self.sync.start, cmd, stdin, out, err, max_output))

    async def write_file(self, path: str, data: bytes | str, timeout: float = 300.0) -> None:
        await asyncio.to_thread(self.sync.write_file, path, data, timeout)

    async def read_file(self, path: str, timeout: float = 300.0, max_bytes: int | None = None) -> bytes:
        return await asyncio.to_thread(self.sync.read_file, path, timeout, max_bytes)

    async def list_files(self, path: str, timeout: float = 60.0) -> list[FileEntry]:
        return await asyncio.to_thread(self.sync.list_files, path, timeout)

    async def delete_file(self, path: str, recursive: bool = False, timeout: float = 60.0) -> None:
        await asyncio.to_thread(self.sync.delete_file, path, recursive, timeout)

    async def watch(self, path: str, interval: float = 1.0, timeout: float | None = None) -> AsyncIterator[FileEvent]:
        """As :meth:`Sandbox.watch`: ``async for event in await sandbox.watch(path)`` (the first
        listing is taken when awaited); the waits between listings are the loop's."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        seen = {e.name: e for e in await self.list_files(path)}
        return self._changes(path, seen, interval, deadline)

    async def _changes(
        self, path: str, seen: dict[str, FileEntry], interval: float, deadline: float | None
    ) -> AsyncIterator[FileEvent]:
        loop = asyncio.get_running_loop()
        while deadline is None or loop.time() < deadline:
            await asyncio.sleep(interval if deadline is None else max(0.0, min(interval, deadline - loop.time())))
            now = {e.name: e for e in await self.list_files(path)}
            for event in changes(seen, now):
                yield event
            seen = now

    async def checkpoint(self, token: str | None = None, timeout: float = 600.0) -> RunFiles:
        return await asyncio.to_thread(self.sync.checkpoint, token, timeout)

    async def stop(self) -> None:
        await asyncio.to_thread(self.sync.stop)

    async def wait_drained(self, timeout: float = 600.0) -> RunFiles:
        return await asyncio.to_thread(self.sync.wait_drained, timeout)

    async def files(self, attempt: int | None = None, checkpoint: int | None = None) -> RunFiles:
        return await asyncio.to_thread(self.sync.files, attempt, checkpoint)

    async def delete(self) -> None:
        await asyncio.to_thread(self.sync.delete)


class AsyncSandboxes:
    """:class:`~sandboxrun.Sandboxes` for asyncio: the same arguments, or ``sync=`` one made."""

    def __init__(self, namespace: str | None = None, *, sync: Sandboxes | None = None, **kwargs: Any) -> None:
        self.sync = sync or Sandboxes(namespace, **kwargs)
        self.namespace = self.sync.namespace

    async def create(self, **kwargs: Any) -> AsyncSandbox:
        """As :meth:`Sandboxes.create` (keyword arguments only)."""
        return AsyncSandbox(await asyncio.to_thread(lambda: self.sync.create(**kwargs)))

    async def get(self, name: str) -> AsyncSandbox:
        return AsyncSandbox(await asyncio.to_thread(self.sync.get, name))

    async def list(
        self,
        *,
        template: str | None = None,
        template_kind: str | None = None,
        labels: Mapping[str, str] | None = None,
        phase: str | Sequence[str] | None = None,
    ) -> list[AsyncSandbox]:
        found = await asyncio.to_thread(
            lambda: self.sync.list(template=template, template_kind=template_kind, labels=labels, phase=phase)
        )
        return [AsyncSandbox(s) for s in found]
