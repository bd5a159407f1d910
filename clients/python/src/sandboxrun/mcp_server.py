"""``sandboxrun-mcp``: an MCP server (the official ``mcp`` SDK's ``MCPServer``, stdio) whose tools
drive SandboxRuns through this client. Each tool is a thin wrapper over one client method; the
server acts with the kubeconfig (and so the rights) of whoever runs it, never the operator's, in
the kubeconfig's namespace unless ``--namespace`` names another. Inputs are checked by the client
and the apiserver as for any other caller; a command is an argument list handed to the exec API
as it is, never spliced into a shell here.

Every byte a tool returns is bounded (:data:`MAX_RETURNED_BYTES`), and so is what the server
holds to return it: a command's output and a file are read with the bound (the workload chooses
their size), a stored file is hashed as it streams and only its first bytes kept."""

from __future__ import annotations

import argparse
import base64
from collections.abc import Callable, Sequence
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer

from .client import Sandbox, Sandboxes
from .errors import SandboxError
from .exec import ExecResult
from .files import RunFiles, StoredFile

#: The most bytes of a file or of a command's output a tool returns (the rest is cut, and the
#: result says so): an agent's context is small, and the workload controls every byte.
MAX_RETURNED_BYTES = 1 << 20
Encoding = Literal["text", "base64"]
ServerFactory = Callable[[], Sandboxes]


def _cut(data: bytes, limit: int) -> tuple[bytes, bool]:
    limit = max(0, min(limit, MAX_RETURNED_BYTES))
    return data[:limit], len(data) > limit


def _bound(limit: int) -> int:
    return max(0, min(limit, MAX_RETURNED_BYTES))


def _content(data: bytes, encoding: Encoding, limit: int, size: int | None = None) -> dict[str, Any]:
    """``data`` cut at ``limit``; ``size`` the whole file's when known (else ``len(data)``, or
    ``None`` when ``data`` was already cut: the rest was never read)."""
    kept, truncated = _cut(data, limit)
    text = base64.b64encode(kept).decode() if encoding == "base64" else kept.decode("utf-8", "replace")
    whole = size if size is not None else (None if truncated else len(data))
    return {"content": text, "encoding": encoding, "size": whole, "truncated": truncated or (size or 0) > len(kept)}


def _sandbox(s: Sandbox) -> dict[str, Any]:
    return {"name": s.name, "namespace": s.namespace, "template": s.template, "phase": s.phase, "labels": s.labels}


def _file(f: StoredFile) -> dict[str, Any]:
    return {"path": f.container_path, "size": f.size, "sha256": f.sha256}


def _result(r: ExecResult, limit: int) -> dict[str, Any]:
    out, out_cut = _cut(r.stdout_bytes, limit)
    err, err_cut = _cut(r.stderr_bytes, limit)
    return {
        "exit_code": r.exit_code,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
        "truncated": out_cut or err_cut or r.stdout_truncated or r.stderr_truncated,
    }


def _find(files: RunFiles, path: str) -> StoredFile:
    for f in files.files():
        if f.container_path == path:
            return f
    raise SandboxError(f"{files.run}: no stored file {path!r}")


def build_server(sandboxes: ServerFactory) -> MCPServer[Any]:
    """The server and its tools; ``sandboxes`` is called once, on the first tool call (so the
    server starts, and lists its tools, without a cluster)."""
    server: MCPServer[Any] = MCPServer(
        "sandboxrun",
        instructions="Create SandboxRuns from templates (or fork them from another's files), run commands in "
        "them, read and write their files, checkpoint, pause, resume and stop them, and read back the files "
        "they stored.",
    )
    held: list[Sandboxes] = []

    def client() -> Sandboxes:
        if not held:
            held.append(sandboxes())
        return held[0]

    _lifecycle_tools(server, client)
    _inside_tools(server, client)
    _store_tools(server, client)
    return server


def _lifecycle_tools(server: MCPServer[Any], client: ServerFactory) -> None:
    @server.tool()
    def create_sandbox(
        template: str,
        name: str | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        wait_seconds: float = 300.0,
        keep_workspace: bool = False,
        fork_from: str | None = None,
        fork_attempt: int | None = None,
        fork_checkpoint: int | None = None,
    ) -> dict[str, Any]:
        """Creates a sandbox (a SandboxRun) from the SandboxRunTemplate `template`, setting only the
        fields the template leaves open (`command`, `env`), and waits until it runs. Without a
        command it is a long-lived sandbox driven by `run_command` until `stop_sandbox`.
        `keep_workspace`: `resume_sandbox` gives it back the files it was paused with.
        `fork_from`: it starts with the saved files of that sandbox (its latest, or attempt
        `fork_attempt`, or checkpoint `fork_checkpoint` of one that keeps running). Both need a `command` (e.g. ["sleep", "86400"])."""
        fork = fork_from if fork_attempt is None or fork_from is None else (fork_from, fork_attempt)
        restore = "Latest" if keep_workspace else None
        created = client().create(
            template=template,
            name=name,
            command=command,
            env=env,
            labels=labels,
            workspace_restore=restore,
            fork_from=fork,
            fork_checkpoint=fork_checkpoint,
        )
        created.wait_running(timeout=wait_seconds)
        return _sandbox(client().get(created.name))

    @server.tool()
    def pause_sandbox(name: str, wait_seconds: float = 600.0) -> dict[str, Any]:
        """Pauses the sandbox: its read-back paths are saved to the store, its pod deleted (its
        quota freed). Waits until it is paused (`wait_seconds` 0: returns at once)."""
        status = client().get(name).pause(wait=wait_seconds > 0, timeout=wait_seconds)
        return {"name": name, "phase": status.phase, "paused": wait_seconds > 0}

    @server.tool()
    def resume_sandbox(name: str, wait_seconds: float = 300.0) -> dict[str, Any]:
        """Resumes a paused sandbox on a new pod; made with `keep_workspace`, its read-back paths
        hold the files it was paused with before anything runs. Waits until it runs
        (`wait_seconds` 0: returns at once); a restore that failed is an error."""
        sandbox = client().get(name)
        sandbox.resume(wait=wait_seconds > 0, timeout=wait_seconds)
        return _sandbox(client().get(name))

    @server.tool()
    def list_sandboxes(
        template: str | None = None, labels: dict[str, str] | None = None, phase: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """The namespace's sandboxes, made from `template`, carrying every one of `labels`, in one
        of `phase` (each filter optional)."""
        return [_sandbox(s) for s in client().list(template=template, labels=labels, phase=phase)]

    @server.tool()
    def checkpoint(name: str, token: str | None = None, wait_seconds: float = 600.0) -> dict[str, Any]:
        """Saves the running sandbox's read-back paths to the store now, without stopping it, and
        lists the files saved (a checkpoint is read back, not restored: `pause_sandbox` and
        `resume_sandbox` keep the files). `checkpoint` is its index: `create_sandbox(fork_from=name,
        fork_checkpoint=...)` starts a new sandbox with these files."""
        saved = client().get(name).checkpoint(token, timeout=wait_seconds)
        files = [_file(f) for f in saved.files()]
        return {"phase": saved.status.phase, "checkpoint": saved.checkpoint, "files": files}

    @server.tool()
    def stop_sandbox(name: str, wait_seconds: float = 600.0) -> dict[str, Any]:
        """Stops the sandbox: its read-back paths are drained to the store, then its pod is
        released. Waits for the drain (`wait_seconds` 0: returns at once) and lists the stored
        files. A drain that failed is an error, never an empty list."""
        sandbox = client().get(name)
        sandbox.stop()
        if wait_seconds <= 0:
            return {"phase": sandbox.status().phase, "files": []}
        drained = sandbox.wait_drained(timeout=wait_seconds)
        return {"phase": drained.status.phase, "files": [_file(f) for f in drained.files()]}


def _inside_tools(server: MCPServer[Any], client: ServerFactory) -> None:
    @server.tool()
    def run_command(
        name: str,
        command: list[str],
        stdin: str | None = None,
        timeout_seconds: float = 300.0,
        max_bytes: int = MAX_RETURNED_BYTES,
    ) -> dict[str, Any]:
        """Runs `command` (an argument list, run as it is: for a shell pass ["sh", "-c", "..."]) in
        the sandbox's workload container and returns its exit code, stdout and stderr (each cut
        at `max_bytes`). A non-zero exit is a result; still running after `timeout_seconds`, it
        is killed and the call fails."""
        raw = stdin.encode() if stdin is not None else None
        sandbox = client().get(name)
        result = sandbox.run(list(command), stdin=raw, timeout=timeout_seconds, max_output=_bound(max_bytes))
        return _result(result, max_bytes)

    @server.tool()
    def write_file(name: str, path: str, content: str, encoding: Encoding = "text") -> dict[str, Any]:
        """Writes `content` (text, or base64 with `encoding` "base64") to `path` in the sandbox.
        The directory must exist and be writable by the run's user (a read-back path is)."""
        data = base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
        client().get(name).write_file(path, data)
        return {"path": path, "size": len(data)}

    @server.tool()
    def read_file(name: str, path: str, encoding: Encoding = "text", max_bytes: int = MAX_RETURNED_BYTES) -> dict[str, Any]:
        """The content of `path` in the running sandbox, as text (undecodable bytes replaced) or
        base64, cut at `max_bytes`."""
        limit = _bound(max_bytes)
        # `head -c` stops reading one byte past the bound: that byte says the file was longer.
        result = client().get(name).run(["head", "-c", str(limit + 1), "--", path], max_output=limit + 1)
        if not result.ok:
            raise SandboxError(f"read {path}: exit {result.exit_code}: {result.stderr.strip()}")
        return _content(result.stdout_bytes, encoding, limit)


    @server.tool()
    def list_files(name: str, path: str) -> list[dict[str, Any]]:
        """The entries of the directory `path` in the running sandbox (dot files too): name,
        type (file, directory, symlink, ...), size, mtime (seconds), mode. Symlinks are not
        followed."""
        return [
            {"name": e.name, "path": e.path, "type": e.type, "size": e.size, "mtime": e.mtime, "mode": oct(e.mode)}
            for e in client().get(name).list_files(path)
        ]

    @server.tool()
    def delete_file(name: str, path: str, recursive: bool = False) -> dict[str, Any]:
        """Deletes `path` in the running sandbox (`recursive`: a directory and what it holds). A
        path that does not exist is not an error."""
        client().get(name).delete_file(path, recursive)
        return {"path": path, "deleted": True}


def _store_tools(server: MCPServer[Any], client: ServerFactory) -> None:
    @server.tool()
    def list_stored_files(
        name: str, checkpoint: int | None = None, attempt: int | None = None
    ) -> list[dict[str, Any]]:
        """The files a stopped sandbox's drain stored (its read-back paths), with sizes and sha256;
        with `checkpoint` N, the files checkpoint N saved (readable while it runs); with `attempt`
        N, the files attempt N left. A drain that failed is an error, never an empty list."""
        return [_file(f) for f in client().get(name).files(attempt, checkpoint).files()]

    @server.tool()
    def fetch_stored_file(
        name: str,
        path: str,
        encoding: Encoding = "text",
        max_bytes: int = MAX_RETURNED_BYTES,
        checkpoint: int | None = None,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """The content of the stored file `path` (as `list_stored_files` names it) of a stopped
        sandbox (or of its `checkpoint` / `attempt` N), read from the store and checked against
        its manifest's sha256."""
        files = client().get(name).files(attempt, checkpoint)
        stored = _find(files, path)
        return _content(files.fetch(stored, _bound(max_bytes)), encoding, max_bytes, stored.size)


def main(argv: Sequence[str] | None = None) -> None:
    """``sandboxrun-mcp [--namespace NS] [--kubeconfig PATH] [--context NAME]``: serves over stdio.
    The store is read with boto3's environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, …)."""
    parser = argparse.ArgumentParser(prog="sandboxrun-mcp", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--namespace", help="the namespace of the sandboxes (default: the kubeconfig's)")
    parser.add_argument("--kubeconfig", help="the kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", help="the kubeconfig's context (default: its current one)")
    args = parser.parse_args(argv)
    build_server(lambda: Sandboxes(args.namespace, kubeconfig=args.kubeconfig, context=args.context)).run("stdio")


if __name__ == "__main__":
    main()
