"""Pause, resume and fork through the client on the bed (docs/user-guide.md "Pause, resume and
fork"): real containers on the real node, the operator binary as a process of this test run,
drains into and restores from the bed's S3 server."""

from __future__ import annotations

import pytest
from conftest import AGENT_TEMPLATE, Bed

from sandboxrun import Sandbox

pytestmark = pytest.mark.bed


def _running(b: Bed, sandbox: Sandbox, timeout: float = 180) -> None:
    try:
        sandbox.wait_running(timeout=timeout)
    except Exception as e:
        raise AssertionError(f"{sandbox} did not run: {e}{b.diagnose()}") from e


def test_a_paused_sandbox_resumes_with_its_files_and_a_fork_starts_with_them(good: Bed) -> None:
    sandbox = good.sandboxes.create(
        template=AGENT_TEMPLATE, generate_name="pause-", command=["sleep", "3600"], workspace_restore="Latest"
    )
    _running(good, sandbox)
    sandbox.write_file("/work/out/notes.txt", "kept\n")
    sandbox.run("mkdir -p /work/out/sub && echo deep > /work/out/sub/deep.txt")

    paused = sandbox.pause(timeout=180)
    assert paused.phase == "Pending", f"{paused}{good.diagnose()}"
    resumed = sandbox.resume(timeout=180)
    assert resumed.phase == "Running", f"{resumed}{good.diagnose()}"
    # The files are there before anything runs, owned by the run's user.
    assert sandbox.read_file("/work/out/notes.txt") == b"kept\n"
    seen = sandbox.run("cat /work/out/sub/deep.txt; stat -c %u /work/out/notes.txt")
    assert seen.stdout.split() == ["deep", "1000"], seen

    fork = good.sandboxes.create(
        template=AGENT_TEMPLATE, generate_name="fork-", command=["sleep", "3600"], fork_from=sandbox.name
    )
    _running(good, fork)
    assert fork.read_file("/work/out/notes.txt") == b"kept\n", "the fork starts with the paused files"
    for s in (sandbox, fork):
        s.stop()
        s.wait_drained(timeout=180)


def test_a_running_sandboxs_checkpoint_forks_with_the_files_it_had_then(good: Bed) -> None:
    """A fork of a checkpoint (issue #54): the source keeps running and writes on after its
    checkpoint; the fork starts with what the checkpoint saved, not with the later write."""
    sandbox = good.sandboxes.create(template=AGENT_TEMPLATE, generate_name="ckpt-src-", command=["sleep", "3600"])
    _running(good, sandbox)
    sandbox.write_file("/work/out/notes.txt", "at the checkpoint\n")
    saved = sandbox.checkpoint(timeout=180)
    assert saved.checkpoint == 1, f"the first checkpoint's index: {saved.checkpoint}"
    sandbox.write_file("/work/out/notes.txt", "after the checkpoint\n")

    fork = good.sandboxes.create(
        template=AGENT_TEMPLATE,
        generate_name="ckpt-fork-",
        command=["sleep", "3600"],
        fork_from=sandbox.name,
        fork_checkpoint=saved.checkpoint,
    )
    _running(good, fork)
    assert fork.read_file("/work/out/notes.txt") == b"at the checkpoint\n", "the checkpoint's files, not later ones"
    assert sandbox.status().phase == "Running", "the source was never paused"
    assert sandbox.read_file("/work/out/notes.txt") == b"after the checkpoint\n"
    for s in (sandbox, fork):
        s.stop()
        s.wait_drained(timeout=180)
