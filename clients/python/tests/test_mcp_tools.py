"""``sandboxrun-mcp`` without a cluster: the SDK's own client starts it over stdio and sees the
tools and their argument schemas; a call that cannot reach a cluster is an error result."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
from mcp_session import server_parameters, session

TOOLS: dict[str, tuple[set[str], set[str]]] = {
    "create_sandbox": (
        {"template"},
        {"name", "command", "env", "labels", "wait_seconds", "keep_workspace", "fork_from", "fork_attempt", "fork_checkpoint"},
    ),
    "list_sandboxes": (set(), {"template", "labels", "phase"}),
    "run_command": ({"name", "command"}, {"stdin", "timeout_seconds", "max_bytes"}),
    "write_file": ({"name", "path", "content"}, {"encoding"}),
    "read_file": ({"name", "path"}, {"encoding", "max_bytes"}),
    "checkpoint": ({"name"}, {"token", "wait_seconds"}),
    "stop_sandbox": ({"name"}, {"wait_seconds"}),
    "pause_sandbox": ({"name"}, {"wait_seconds"}),
    "resume_sandbox": ({"name"}, {"wait_seconds"}),
    "list_files": ({"name", "path"}, set()),
    "delete_file": ({"name", "path"}, {"recursive"}),
    "list_stored_files": ({"name"}, {"checkpoint", "attempt"}),
    "fetch_stored_file": ({"name", "path"}, {"encoding", "max_bytes", "checkpoint", "attempt"}),
}


def test_the_server_lists_its_tools_with_pause_and_resume(tmp_path: Path) -> None:
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "none"))

    async def listed() -> dict[str, dict[str, Any]]:
        async with session(server_parameters(env)) as s:
            return {t.name: t.input_schema for t in (await s.list_tools()).tools}

    schemas = anyio.run(listed)
    assert set(schemas) == set(TOOLS), set(schemas) ^ set(TOOLS)
    for name, (required, optional) in TOOLS.items():
        schema = schemas[name]
        assert set(schema.get("required", [])) == required, (name, schema)
        assert set(schema["properties"]) == required | optional, (name, schema)
    command = schemas["run_command"]["properties"]["command"]
    assert command["type"] == "array" and command["items"] == {"type": "string"}, "an argument list, never a shell string"


def test_a_tool_that_cannot_reach_a_cluster_is_an_error_not_an_empty_list(tmp_path: Path) -> None:
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "none"))
    env.pop("KUBERNETES_SERVICE_HOST", None)

    async def called() -> tuple[bool, str]:
        async with session(server_parameters(env)) as s:
            result = await s.call_tool("list_sandboxes", {}, read_timeout_seconds=60)
            return result.is_error, " ".join(getattr(c, "text", "") for c in result.content)

    is_error, text = anyio.run(called)
    assert is_error, text
