"""An MCP session with ``sandboxrun-mcp`` as an agent has one: the server started over stdio by
the SDK's own client (``mcp.client.stdio``, ``ClientSession``), nothing of the server imported."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SRC = Path(__file__).resolve().parents[1] / "src"


def server_parameters(env: dict[str, str], *args: str) -> StdioServerParameters:
    """``python -m sandboxrun.mcp_server ARGS`` (what the ``sandboxrun-mcp`` script runs)."""
    child = dict(env)
    child["PYTHONPATH"] = os.pathsep.join([str(SRC), *([child["PYTHONPATH"]] if child.get("PYTHONPATH") else [])])
    return StdioServerParameters(command=sys.executable, args=["-m", "sandboxrun.mcp_server", *args], env=child)


@asynccontextmanager
async def session(params: StdioServerParameters) -> AsyncIterator[ClientSession]:
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                yield s


async def call(s: ClientSession, tool: str, **arguments: Any) -> Any:
    """The tool's structured result; an error result fails with its text."""
    result = await s.call_tool(tool, arguments, read_timeout_seconds=600)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        raise AssertionError(f"{tool}({arguments}) failed: {text}")
    if result.structured_content is not None:
        content = result.structured_content
        # A tool returning a list or a dict is wrapped as {"result": ...} when the schema needs an object.
        return content["result"] if isinstance(content, dict) and set(content) == {"result"} else content
    return json.loads(text)
