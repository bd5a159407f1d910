"""The client against the real bed: real containers on the real node, the operator binary as a
process of this test run, drains into the bed's S3 server, read back with boto3."""

from __future__ import annotations

import os

import bed
import pytest
from conftest import AGENT_TEMPLATE, Bed

from sandboxrun import CommandFailed, DrainFailed, RunFailed, Sandbox

pytestmark = pytest.mark.bed


def _running(b: Bed, sandbox: Sandbox) -> None:
    try:
        sandbox.wait_running(timeout=120)
    except Exception as e:
        raise AssertionError(f"{sandbox} did not run: {e}{b.diagnose()}") from e


def test_the_agent_loop_end_to_end(good: Bed) -> None:
    sandbox = good.sandboxes.create(template=AGENT_TEMPLATE, generate_name="agent-")
    _running(good, sandbox)
    assert all(p.phase == "Pending" for p in sandbox.status().read_back), "nothing is drained while it runs"

    wrote = sandbox.run("id -u; printf 'result 42\\n' > /work/out/answer.txt; echo to-stderr >&2")
    assert (wrote.exit_code, wrote.stdout, wrote.stderr) == (0, "1000\n", "to-stderr\n")
    assert sandbox.read_file("/work/out/answer.txt") == b"result 42\n"

    failing = sandbox.run(["sh", "-c", "echo nope >&2; exit 7"])
    assert (failing.exit_code, failing.ok, failing.stderr) == (7, False, "nope\n")
    missing = sandbox.run(["cat", "/work/out/missing"])
    assert missing.exit_code == 1 and "missing" in missing.stderr
    with pytest.raises(CommandFailed) as raised:
        sandbox.read_file("/work/out/missing")
    assert raised.value.exit_code == 1

    sandbox.stop()
    drained = sandbox.wait_drained(timeout=120)
    assert drained.status.phase == "Stopped", drained.status
    (path,) = drained.status.read_back
    assert (path.path, path.phase) == ("/work/out", "Drained"), path
    assert path.object is not None and path.object.startswith(good.store_url + "/")
    assert path.object.endswith(".tar.zst"), "the template asks for zstd"
    listed = drained.files()
    assert [(f.container_path, f.size) for f in listed] == [("/work/out/answer.txt", 10)]
    assert drained.fetch(listed[0]) == b"result 42\n"


def test_a_checkpoint_saves_files_while_the_sandbox_runs(good: Bed) -> None:
    sandbox = good.sandboxes.create(template=AGENT_TEMPLATE, generate_name="checkpoint-")
    _running(good, sandbox)
    sandbox.write_file("/work/out/step1.txt", "one\n")
    saved = sandbox.checkpoint("c1", timeout=120)
    assert [(f.container_path, saved.fetch(f)) for f in saved.files()] == [("/work/out/step1.txt", b"one\n")], saved.status
    assert sandbox.status().phase == "Running", "a checkpoint does not stop the sandbox"
    sandbox.write_file("/work/out/step2.txt", "two\n")
    again = sandbox.checkpoint(timeout=120)
    assert sorted(f.path for f in again.files()) == ["step1.txt", "step2.txt"]
    sandbox.stop()
    sandbox.wait_drained(timeout=120)


def test_write_file_and_read_file_round_trip_binary_bytes(good: Bed, tmp_path) -> None:
    spec = bed.real_node_spec(good.env, ["/work/out"], compression="gzip")
    sandbox = good.sandboxes.create(spec=spec, generate_name="binary-")
    _running(good, sandbox)
    blob = bytes(range(256)) * 1024 + os.urandom(300_000) + b"\r\n\x00tail"
    sandbox.write_file("/work/out/blob.bin", blob)
    assert sandbox.read_file("/work/out/blob.bin") == blob
    assert sandbox.run(["wc", "-c", "/work/out/blob.bin"]).stdout.split()[0] == str(len(blob))
    sandbox.write_file("/work/out/empty", b"")
    assert sandbox.read_file("/work/out/empty") == b""
    with pytest.raises(CommandFailed):
        sandbox.write_file("/no-such-dir/x", b"x")

    sandbox.stop()
    drained = sandbox.wait_drained(timeout=120)
    by_path = {f.path: f for f in drained.files()}
    assert set(by_path) == {"blob.bin", "empty"}
    assert drained.fetch(by_path["blob.bin"]) == blob
    (out,) = drained.download(tmp_path)
    assert (out / "blob.bin").read_bytes() == blob and (out / "empty").read_bytes() == b""


def test_an_empty_path_is_listed_as_empty_without_error(good: Bed) -> None:
    spec = bed.real_node_spec(good.env, ["/work/out", "/work/nothing"])
    sandbox = good.sandboxes.create(spec=spec, generate_name="empty-")
    _running(good, sandbox)
    assert sandbox.run("echo x > /work/out/x").ok
    sandbox.stop()
    drained = sandbox.wait_drained(timeout=120)
    phases = {p.path: p.phase for p in drained.status.read_back}
    assert phases == {"/work/out": "Drained", "/work/nothing": "Empty"}, drained.status
    assert [f.container_path for f in drained.files()] == ["/work/out/x"]
    assert [p.status.path for p in drained.paths()] == ["/work/out", "/work/nothing"]


def test_a_drain_the_store_refuses_raises_drain_failed(broken: Bed) -> None:
    spec = bed.real_node_spec(broken.env, ["/work/out", "/work/nothing"])
    sandbox = broken.sandboxes.create(spec=spec, generate_name="refused-")
    _running(broken, sandbox)
    assert sandbox.run("echo lost > /work/out/x").ok
    sandbox.stop()
    with pytest.raises(DrainFailed) as raised:
        sandbox.wait_drained(timeout=120)
    err = raised.value
    failed = {p.path: p.message for p in err.failed}
    # Both paths fail: the store refuses the empty one's commit too. Neither is reported Empty.
    assert set(failed) == {"/work/out", "/work/nothing"}, f"{err}{broken.diagnose()}"
    assert all("S3 refused the operator's credentials" in m for m in failed.values()), failed
    assert err.event_note is not None and "/work/out" in err.event_note, err.event_note
    with pytest.raises(DrainFailed):
        sandbox.files()


def test_a_run_that_cannot_start_raises_run_failed(good: Bed) -> None:
    spec = bed.real_node_spec(good.env, ["/work/out"])
    spec["image"] = spec["image"].split("@")[0].rsplit(":", 1)[0] + ":no-such-tag"
    sandbox = good.sandboxes.create(spec=spec, generate_name="nopull-")
    with pytest.raises(RunFailed) as raised:
        sandbox.wait_running(timeout=120)
    assert raised.value.phase == "Failed" and raised.value.reason == "ImagePullFailed", raised.value
