"""The agent loop of the docs runs on the bed exactly as written: docs/user-guide.md's snippet
(between ``<!-- agent-loop`` and ``<!-- /agent-loop -->``) is executed as a script, with only a
kubeconfig whose context names the test's namespace and boto3's environment for the S3 server.
README.md shows the same snippet."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import bed
import pytest
from conftest import Bed

pytestmark = pytest.mark.bed

_SNIPPET = re.compile(r"<!-- agent-loop[^>]*-->\s*```python\n(.*?)```\s*<!-- /agent-loop -->", re.DOTALL)


def agent_loop(doc: Path) -> str:
    found = _SNIPPET.findall(doc.read_text())
    assert len(found) == 1, f"{doc}: expected one agent-loop snippet, found {len(found)}"
    return found[0]


def test_the_readme_shows_the_user_guides_loop() -> None:
    assert agent_loop(bed.REPO / "README.md") == agent_loop(bed.REPO / "docs/user-guide.md")


def _snippet_env(good: Bed, tmp_path: Path) -> dict[str, str]:
    """A kubeconfig whose context names the test's namespace and boto3's environment for the S3
    server: all a snippet is given."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(Path(good.env["KUBECONFIG"]).read_text())
    env = dict(good.env)
    env.update(
        {
            "KUBECONFIG": str(kubeconfig),
            "AWS_ENDPOINT_URL": good.s3.endpoint,
            "AWS_ACCESS_KEY_ID": good.s3.access_key,
            "AWS_SECRET_ACCESS_KEY": good.s3.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "PYTHONPATH": str(bed.REPO / "clients/python/src"),
        }
    )
    bed.kubectl(env, "config", "set-context", "--current", f"--namespace={good.namespace}")
    return env


def _run_snippet(good: Bed, tmp_path: Path, code: str, env: dict[str, str] | None = None) -> str:
    """Runs ``code`` as a script with only a kubeconfig whose context names the test's namespace
    and boto3's environment for the S3 server (or `env`); its stdout."""
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = env or _snippet_env(good, tmp_path)
    done = subprocess.run(
        [sys.executable, str(script)], check=False, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}{good.diagnose()}"
    return done.stdout


def test_the_user_guides_agent_loop_runs_on_the_bed(good: Bed, tmp_path: Path) -> None:
    code = agent_loop(bed.REPO / "docs/user-guide.md")
    assert 10 <= len([line for line in code.splitlines() if line.strip()]) <= 12, "about ten lines"
    stdout = _run_snippet(good, tmp_path, code)
    assert stdout.splitlines() == [
        "$ echo hello > /work/out/hello.txt -> exit 0: ",
        "$ cat /work/out/hello.txt -> exit 0: hello",
        "$ ls /nowhere -> exit 1: ",
        "/work/out/hello.txt b'hello\\n'",
    ], stdout


_ASYNC = re.compile(r"<!-- agent-async[^>]*-->\s*```python\n(.*?)```\s*<!-- /agent-async -->", re.DOTALL)


def test_the_user_guides_async_example_runs_on_the_bed(good: Bed, tmp_path: Path) -> None:
    (code,) = _ASYNC.findall((bed.REPO / "docs/user-guide.md").read_text())
    stdout = _run_snippet(good, tmp_path, code)
    assert stdout.splitlines() == [
        "True ['step', '1', 'step', '2', 'step', '3']",
        "killed: True",
        "listed: True",
    ], stdout


_FILES = re.compile(r"<!-- agent-files[^>]*-->\s*```python\n(.*?)```\s*<!-- /agent-files -->", re.DOTALL)


def test_the_user_guides_files_example_runs_on_the_bed(good: Bed, tmp_path: Path) -> None:
    (code,) = _FILES.findall((bed.REPO / "docs/user-guide.md").read_text())
    stdout = _run_snippet(good, tmp_path, code)
    assert stdout.splitlines() == [
        "['created', 'deleted'] ['draft.txt']",
        "['draft.txt'] Running",
    ], stdout


_PAUSE = re.compile(r"<!-- agent-pause[^>]*-->\s*```python\n(.*?)```\s*<!-- /agent-pause -->", re.DOTALL)


def test_the_user_guides_pause_resume_and_fork_example_runs_on_the_bed(good: Bed, tmp_path: Path) -> None:
    (code,) = _PAUSE.findall((bed.REPO / "docs/user-guide.md").read_text())
    stdout = _run_snippet(good, tmp_path, code)
    assert stdout.splitlines() == ["b'step 1 done\\n'", "b'step 1 done\\n'"], stdout


_MCP = re.compile(r"<!-- agent-mcp[^>]*-->\s*```python\n(.*?)```\s*<!-- /agent-mcp -->", re.DOTALL)


def test_the_user_guides_mcp_example_runs_on_the_bed(good: Bed, tmp_path: Path) -> None:
    """The MCP session of the docs, as written: `sandboxrun-mcp` is what `pip install
    'sandboxrun[mcp]'` puts on PATH; here a script of that name runs the server of this checkout.
    The SDK starts a server with a few safe variables only (HOME, PATH, ...), so the script
    carries the bed's kubeconfig and store settings, as a user's ~/.kube/config and ~/.aws
    would."""
    (code,) = _MCP.findall((bed.REPO / "docs/user-guide.md").read_text())
    env = _snippet_env(good, tmp_path)
    shim = tmp_path / "bin" / "sandboxrun-mcp"
    shim.parent.mkdir()
    carried = ("KUBECONFIG", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "PYTHONPATH")
    exports = "".join(f"export {k}={shlex.quote(env[k])}\n" for k in carried)
    shim.write_text(f"#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} -m sandboxrun.mcp_server \"$@\"\n")
    shim.chmod(0o755)
    env["PATH"] = f"{shim.parent}{os.pathsep}{env.get('PATH', '')}"
    stdout = _run_snippet(good, tmp_path, code, env)
    assert stdout.splitlines() == ["1. read the repo", "['/work/out/plan.md']"], stdout
