"""Commands against a fake exec stream: the pid line, streamed output, background handles, kill,
the timeout. The same paths run on the bed in test_bed_commands.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

import sandboxrun.exec as execmod
from sandboxrun import Timeout
from sandboxrun.exec import KILL_SCRIPT, PID_SCRIPT

SUCCESS = json.dumps({"status": "Success"})


class FakeStream:
    """The websocket ``kubernetes.stream`` returns: frames delivered one per ``update``; it
    closes after the last unless ``hold`` (then it stays open until ``release``)."""

    def __init__(self, frames: list[tuple[str, bytes]], status: str = SUCCESS, hold: bool = False) -> None:
        self.frames = list(frames)
        self.status = status
        self.out = bytearray()
        self.err = bytearray()
        self.stdin = bytearray()
        self.held = threading.Event()
        if not hold:
            self.held.set()

    def is_open(self) -> bool:
        return bool(self.frames) or not self.held.is_set()

    def update(self, timeout: float = 0) -> None:
        if self.frames:
            channel, data = self.frames.pop(0)
            (self.out if channel == "out" else self.err).extend(data)
        else:
            self.held.wait(timeout)

    def read_stdout(self, timeout: float = 0) -> bytes:
        data, self.out = bytes(self.out), bytearray()
        return data

    def read_stderr(self, timeout: float = 0) -> bytes:
        data, self.err = bytes(self.err), bytearray()
        return data

    def read_channel(self, channel: int) -> str:
        return self.status

    def write_channel(self, channel: int, data: bytes) -> None:
        self.stdin.extend(data)

    def close(self) -> None:
        pass


def _opened(monkeypatch: pytest.MonkeyPatch, streams: list[FakeStream]) -> list[list[str]]:
    commands: list[list[str]] = []

    def fake_open(api: Any, namespace: str, pod: str, command: list[str], with_stdin: bool) -> FakeStream:
        commands.append(command)
        return streams.pop(0)

    monkeypatch.setattr(execmod, "_open", fake_open)
    return commands


def test_output_streams_to_the_callbacks_without_the_pid_line(monkeypatch: pytest.MonkeyPatch) -> None:
    euro = "€".encode()
    frames = [("out", b"41"), ("out", b"7\nhel"), ("err", b"warn\n"), ("out", b"lo " + euro[:1]), ("out", euro[1:])]
    commands = _opened(monkeypatch, [FakeStream(frames)])
    seen: list[tuple[str, str]] = []
    result = execmod.exec_in(
        None,  # type: ignore[arg-type]
        "ns",
        "p",
        ["echo", "$(x)"],
        on_stdout=lambda t: seen.append(("out", t)),
        on_stderr=lambda t: seen.append(("err", t)),
    )
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello €", "warn\n")
    assert seen == [("out", "hel"), ("err", "warn\n"), ("out", "lo "), ("out", "€")], "a split character once, whole"
    assert commands == [["sh", "-c", PID_SCRIPT, "sh", "echo", "$(x)"]], "the command is an argument, never script"


def test_a_background_command_is_waited_for_and_killed_by_its_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    running = FakeStream([("out", b"4242\n"), ("out", b"tick\n")], hold=True)
    kill = FakeStream([], SUCCESS)
    commands = _opened(monkeypatch, [running, kill])
    handle = execmod.start(None, "ns", "p", "sleep 100")  # type: ignore[arg-type]
    with pytest.raises(Timeout):
        handle.wait(timeout=0.2)
    assert handle.running and handle.pid == 4242
    with pytest.raises(ValueError):
        handle.kill("TERM; rm -rf /")
    handle.kill("TERM")
    assert commands[1] == ["sh", "-c", KILL_SCRIPT, "sh", "TERM", "4242"]
    running.status = json.dumps(
        {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "143"}]}}
    )
    running.held.set()
    result = handle.wait(timeout=5)
    assert (result.exit_code, result.stdout, handle.running) == (143, "tick\n", False)


def test_a_command_past_its_timeout_is_killed_then_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    running = FakeStream([("out", b"77\n"), ("out", b"partial")], hold=True)
    commands = _opened(monkeypatch, [running, FakeStream([])])
    with pytest.raises(Timeout) as raised:
        execmod.exec_in(None, "ns", "p", ["sleep", "1000"], timeout=0.3)  # type: ignore[arg-type]
    assert commands[1] == ["sh", "-c", KILL_SCRIPT, "sh", "KILL", "77"], "the command does not outlive its timeout"
    assert "7 byte(s) of stdout" in raised.value.last
    running.held.set()


def test_stdin_is_sent_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = FakeStream([("out", b"1\nok")])
    commands = _opened(monkeypatch, [stream])
    result = execmod.exec_in(None, "ns", "p", ["cat"], stdin=b"abc")  # type: ignore[arg-type]
    assert result.stdout == "ok" and bytes(stream.stdin) == b"abc"
    assert commands[0] == ["sh", "-c", PID_SCRIPT, "sh", "sh", "-c", 'head -c "$0" | "$@"', "3", "cat"]
