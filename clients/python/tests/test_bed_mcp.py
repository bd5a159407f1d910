"""An agent loop through MCP only, against the bed: ``sandboxrun-mcp`` started over stdio by the
SDK's own client, a sandbox from a template on the real node, a command, a file written and read
back, a checkpoint, a stop, and the stored file fetched from the bed's S3 server. The server runs
with the test's kubeconfig and the store's credentials in boto3's environment, nothing more."""

from __future__ import annotations

import anyio
import pytest
from conftest import AGENT_TEMPLATE, Bed
from mcp_session import call, server_parameters, session

pytestmark = pytest.mark.bed


def _server_env(b: Bed) -> dict[str, str]:
    env = dict(b.env)
    env.update(
        AWS_ENDPOINT_URL=b.s3.endpoint,
        AWS_ACCESS_KEY_ID=b.s3.access_key,
        AWS_SECRET_ACCESS_KEY=b.s3.secret_key,
        AWS_DEFAULT_REGION="us-east-1",
    )
    return env


async def _agent_loop(b: Bed) -> None:
    params = server_parameters(_server_env(b), "--namespace", b.namespace, "--kubeconfig", b.env["KUBECONFIG"])
    async with session(params) as s:
        made = await call(s, "create_sandbox", template=AGENT_TEMPLATE, labels={"agent": "mcp"}, wait_seconds=120)
        name = made["name"]
        assert (made["namespace"], made["template"], made["phase"]) == (b.namespace, AGENT_TEMPLATE, "Running"), made
        listed = await call(s, "list_sandboxes", labels={"agent": "mcp"})
        assert [x["name"] for x in listed] == [name], listed

        ran = await call(s, "run_command", name=name, command=["sh", "-c", "id -u; echo oops >&2; exit 3"])
        assert (ran["exit_code"], ran["stdout"], ran["stderr"], ran["truncated"]) == (3, "1000\n", "oops\n", False), ran
        # An argument is an argument: nothing of it reaches a shell.
        literal = await call(s, "run_command", name=name, command=["echo", "$(id -u); true"])
        assert literal["stdout"] == "$(id -u); true\n", literal

        wrote = await call(s, "write_file", name=name, path="/work/out/notes.txt", content="step one\n")
        assert wrote == {"path": "/work/out/notes.txt", "size": 9}, wrote
        read = await call(s, "read_file", name=name, path="/work/out/notes.txt")
        assert (read["content"], read["size"], read["truncated"]) == ("step one\n", 9, False), read
        cut = await call(s, "read_file", name=name, path="/work/out/notes.txt", encoding="base64", max_bytes=4)
        assert (cut["content"], cut["truncated"]) == ("c3RlcA==", True), cut

        await call(s, "run_command", name=name, command=["sh", "-c", "mkdir /work/out/tmp && yes | head -c 3000000 > /work/out/tmp/big"])
        entries = await call(s, "list_files", name=name, path="/work/out")
        assert sorted((e["name"], e["type"]) for e in entries) == [("notes.txt", "file"), ("tmp", "directory")], entries
        big = await call(s, "read_file", name=name, path="/work/out/tmp/big", max_bytes=10_000_000)
        assert (len(big["content"]), big["size"], big["truncated"]) == (1 << 20, None, True), "cut at 1 MiB, never held whole"
        loud = await call(s, "run_command", name=name, command=["sh", "-c", "yes | head -c 3000000"])
        assert (len(loud["stdout"]), loud["truncated"]) == (1 << 20, True)
        await call(s, "delete_file", name=name, path="/work/out/tmp", recursive=True)
        assert [e["name"] for e in await call(s, "list_files", name=name, path="/work/out")] == ["notes.txt"]

        saved = await call(s, "checkpoint", name=name, token="c1", wait_seconds=120)
        assert [(f["path"], f["size"]) for f in saved["files"]] == [("/work/out/notes.txt", 9)], saved
        await call(s, "write_file", name=name, path="/work/out/notes.txt", content="step two\n")

        stopped = await call(s, "stop_sandbox", name=name, wait_seconds=120)
        assert stopped["phase"] == "Stopped", f"{stopped}{b.diagnose()}"
        assert [(f["path"], f["size"]) for f in stopped["files"]] == [("/work/out/notes.txt", 9)], stopped
        stored = await call(s, "list_stored_files", name=name)
        assert [f["path"] for f in stored] == ["/work/out/notes.txt"] and len(stored[0]["sha256"]) == 64, stored
        fetched = await call(s, "fetch_stored_file", name=name, path="/work/out/notes.txt")
        assert fetched["content"] == "step two\n", "the drain stored what the sandbox held at its stop"
        first = await call(s, "fetch_stored_file", name=name, path="/work/out/notes.txt", checkpoint=1, max_bytes=4)
        assert (first["content"], first["size"], first["truncated"]) == ("step", 9, True), first

        missing = await s.call_tool("fetch_stored_file", {"name": name, "path": "/work/out/none"})
        assert missing.is_error, "a file the store does not hold is an error, never empty content"


def test_an_agent_drives_a_sandbox_through_mcp_only(good: Bed) -> None:
    anyio.run(_agent_loop, good)


async def _pause_and_resume(b: Bed) -> None:
    params = server_parameters(_server_env(b), "--namespace", b.namespace, "--kubeconfig", b.env["KUBECONFIG"])
    async with session(params) as s:
        made = await call(
            s, "create_sandbox", template=AGENT_TEMPLATE, command=["sleep", "3600"], keep_workspace=True, wait_seconds=180
        )
        name = made["name"]
        await call(s, "write_file", name=name, path="/work/out/notes.txt", content="before the pause\n")
        paused = await call(s, "pause_sandbox", name=name, wait_seconds=180)
        assert (paused["phase"], paused["paused"]) == ("Pending", True), f"{paused}{b.diagnose()}"
        resumed = await call(s, "resume_sandbox", name=name, wait_seconds=180)
        assert resumed["phase"] == "Running", f"{resumed}{b.diagnose()}"
        read = await call(s, "read_file", name=name, path="/work/out/notes.txt")
        assert read["content"] == "before the pause\n", read
        forked = await call(
            s, "create_sandbox", template=AGENT_TEMPLATE, command=["sleep", "3600"], fork_from=name, wait_seconds=180
        )
        again = await call(s, "read_file", name=forked["name"], path="/work/out/notes.txt")
        assert again["content"] == "before the pause\n", again
        for n in (name, forked["name"]):
            await call(s, "stop_sandbox", name=n, wait_seconds=180)


def test_an_agent_pauses_resumes_and_forks_a_sandbox_through_mcp_only(good: Bed) -> None:
    anyio.run(_pause_and_resume, good)
