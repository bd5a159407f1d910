"""The run lifecycle: create a SandboxRun (from a template or a spec), wait until it runs, exec
into it, stop it, wait for its drain and read its files back from its store."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from .errors import DRAIN_FAILED_REASON, CommandFailed, NotRunning, RunFailed, SandboxError, Timeout
from .exec import ExecResult, Execution, Output, exec_in
from .exec import start as start_in
from .files import RunFiles, StoreReader
from .kube import connect
from .status import RunStatus, check_drain
from .workspace import LIST_SCRIPT, MAX_LISTING_BYTES, FileEntry, FileEvent, changes, generation_status, parse_listing

GROUP = "sandbox.iterion.io"
VERSION = "v1alpha1"
PLURAL = "sandboxruns"
KIND = "SandboxRun"
#: The pause before a watch that ended (or expired, 410) without the awaited state is re-opened.
_POLL = 0.5
#: A watch is re-opened at least this often (seconds), so a dropped connection is noticed.
_WATCH_PERIOD = 300
_LIST_PAGE = 500
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def label_selector(labels: Mapping[str, str]) -> str:
    """``labels`` as an equality label selector (``k=v,k2=v2``). Every key and value must be a
    valid label key and value, so a value can never add a term of its own (``a,b!=c``):
    :class:`ValueError` otherwise."""
    terms = []
    for key, value in labels.items():
        prefix, slash, name = key.rpartition("/")
        valid_key = _LABEL_NAME.match(name) and (not slash or _LABEL_PREFIX.match(prefix))
        if not valid_key or not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise ValueError(f"not a label key and value: {key!r}={value!r}")
        terms.append(f"{key}={value}")
    return ",".join(terms)


def _template_of(obj: Mapping[str, Any]) -> str | None:
    ref = (obj.get("spec") or {}).get("templateRef") or {}
    return ref.get("name")


def _checkpoint(obj: Mapping[str, Any], token: str) -> Mapping[str, Any] | None:
    entries = (obj.get("status") or {}).get("checkpoints") or []
    return next((c for c in entries if c.get("token") == token), None)


def _current_attempt(status: Mapping[str, Any]) -> int:
    return len(status.get("attempts") or []) + 1


def _restores_now(obj: Mapping[str, Any]) -> bool:
    """Whether the run's current attempt starts with its read-back paths restored, as the operator
    decides it (docs/user-guide.md "Pause, resume and fork"): ``restore: Latest`` and an earlier
    attempt whose own restore did not fail, or a fork none of whose attempts was restored yet."""
    workspace = (obj.get("spec") or {}).get("workspace") or {}
    status = obj.get("status") or {}
    current = _current_attempt(status)
    restores = status.get("restores") or []
    failed = {r.get("attempt") for r in restores if r.get("outcome") == "Failed"}
    ended = [a.get("index") for a in status.get("attempts") or [] if (a.get("index") or 0) < current]
    if workspace.get("restore") == "Latest" and any(i not in failed for i in ended):
        return True
    restored = any(r.get("outcome") == "Restored" and (r.get("attempt") or 0) < current for r in restores)
    return bool(workspace.get("from")) and not restored


def _restore_record(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The current attempt's restore record once it was handed to the pod (``delivered``)."""
    status = obj.get("status") or {}
    current = _current_attempt(status)
    records = status.get("restores") or []
    return next((r for r in records if r.get("attempt") == current and r.get("delivered")), None)


def _started(obj: Mapping[str, Any]) -> bool:
    """The run ended, or its pod runs and — when its attempt restores its paths — the restore was
    handed over (the workload started on them, or was refused)."""
    status = RunStatus.from_dict(obj.get("status"))
    if status.final:
        return True
    if status.phase != "Running" or not status.pod_name:
        return False
    return not _restores_now(obj) or _restore_record(obj) is not None


def _paused(obj: Mapping[str, Any]) -> bool:
    status = RunStatus.from_dict(obj.get("status"))
    ready = status.condition("Ready")
    # The operator writes Pending, Ready=False Suspended once the attempt's pod is gone (drained).
    return status.final or (status.phase == "Pending" and ready is not None and ready.reason == "Suspended")


def _workspace(
    restore: str | None, fork_from: str | tuple[str, int] | None, fork_checkpoint: int | None = None
) -> dict[str, Any] | None:
    """``spec.workspace`` for :meth:`Sandboxes.create`."""
    workspace: dict[str, Any] = {}
    if restore is not None:
        if restore not in ("Never", "Latest"):
            raise ValueError(f"workspace_restore must be 'Never' or 'Latest', not {restore!r}")
        workspace["restore"] = restore
    if isinstance(fork_from, str):
        workspace["from"] = {"run": fork_from}
    elif fork_from is not None:
        run, attempt = fork_from
        workspace["from"] = {"run": run, "attempt": int(attempt)}
    if fork_checkpoint is not None:
        if not isinstance(fork_from, str):
            raise ValueError("fork_checkpoint needs fork_from='run' (a run's name, no attempt: one or the other)")
        workspace["from"]["checkpoint"] = int(fork_checkpoint)
    return workspace or None


def _last_seen(obj: Mapping[str, Any]) -> str:
    status = RunStatus.from_dict(obj.get("status"))
    ready = status.condition("Ready")
    return f"phase {status.phase}" + (f", Ready {ready.reason}: {ready.message}" if ready else "")


class Sandbox:
    """One SandboxRun. Get one from :meth:`Sandboxes.create` or :meth:`Sandboxes.get`."""

    def __init__(self, sandboxes: Sandboxes, obj: Mapping[str, Any]) -> None:
        self._sandboxes = sandboxes
        self.name: str = obj["metadata"]["name"]
        self.namespace: str = obj["metadata"]["namespace"]
        self.uid: str = obj["metadata"]["uid"]

        self.labels: dict[str, str] = dict(obj["metadata"].get("labels") or {})
        self.template: str | None = _template_of(obj)
        #: The phase when this object was read (:meth:`status` reads it anew).
        self.phase: str = RunStatus.from_dict(obj.get("status")).phase

    def __repr__(self) -> str:
        return f"Sandbox({self.namespace}/{self.name})"

    def __enter__(self) -> Sandbox:
        """``with``: the sandbox is stopped when the block ends, also when it raises."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Leaving a ``with`` block stops the sandbox (its files are drained as on :meth:`stop`)."""
        self.stop()

    # --- state -------------------------------------------------------------------------------

    def status(self) -> RunStatus:
        """The run's status as the apiserver has it now."""
        obj = self._sandboxes._get(self.name)
        return RunStatus.from_dict(obj.get("status"))

    def _wait(self, what: str, timeout: float, done: Callable[[RunStatus], bool]) -> RunStatus:
        def done_obj(obj: Mapping[str, Any]) -> bool:
            return done(RunStatus.from_dict(obj.get("status")))

        obj = self._sandboxes._watch_until(self.name, what, timeout, done_obj)
        return RunStatus.from_dict(obj.get("status"))

    def wait_running(self, timeout: float = 300.0) -> RunStatus:
        """Waits until the pod runs — and, when its attempt starts with its files restored (a
        resume, a fork), until they were restored and the workload started on them. Raises
        :class:`RunFailed` if the run ends first, :class:`SandboxError` if the restore failed
        (the workload was never started)."""
        obj = self._sandboxes._watch_until(self.name, "to run", timeout, _started)
        status = RunStatus.from_dict(obj.get("status"))
        record = _restore_record(obj) if _restores_now(obj) else None
        if record is not None and record.get("outcome") == "Failed":
            raise SandboxError(f"{self.namespace}/{self.name}: restoring its files failed: {record.get('message')}")
        if status.final:
            raise RunFailed(self.name, status.phase, status.failure_reason(), status.message)
        return status

    # --- pause and resume ----------------------------------------------------------------------

    def _suspend(self, on: bool) -> None:
        body = {"spec": {"suspend": on}}
        self._sandboxes._custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name, body)

    def pause(self, wait: bool = True, timeout: float = 600.0) -> RunStatus:
        """Pauses the sandbox (``spec.suspend: true``): its read-back paths are drained, its pod
        deleted and its quota freed. With ``wait``, returns once that attempt is drained and the
        run is ``Suspended``; raises :class:`RunFailed` if it ended instead. Its files come back on
        :meth:`resume` when it was created with ``workspace_restore="Latest"``
        (docs/user-guide.md "Pause, resume and fork")."""
        self._suspend(True)
        if not wait:
            return self.status()
        obj = self._sandboxes._watch_until(self.name, "to pause", timeout, _paused)
        status = RunStatus.from_dict(obj.get("status"))
        if status.final:
            raise RunFailed(self.name, status.phase, status.failure_reason(), status.message)
        return status

    def resume(self, wait: bool = True, timeout: float = 300.0) -> RunStatus:
        """Resumes a paused sandbox (``spec.suspend: false``): a new pod, its read-back paths
        restored first when the run asks for it. With ``wait``, as :meth:`wait_running`: returns
        once the workload runs on the restored files."""
        self._suspend(False)
        if not wait:
            return self.status()
        return self.wait_running(timeout)

    # --- inside the sandbox ------------------------------------------------------------------

    def _pod(self) -> str:
        status = self.status()
        if status.phase != "Running" or not status.pod_name:
            raise NotRunning(f"{self.namespace}/{self.name} is {status.phase}: its pod does not run")
        return status.pod_name

    def run(
        self,
        cmd: str | Sequence[str],
        stdin: bytes | None = None,
        timeout: float = 300.0,
        on_stdout: Output | None = None,
        on_stderr: Output | None = None,
        max_output: int | None = None,
    ) -> ExecResult:
        """Runs ``cmd`` in the workload container (a string through ``sh -c``) and waits for it; a
        non-zero exit is a result, not an error. ``on_stdout``/``on_stderr`` get its output as
        text while it runs. Still running after ``timeout`` seconds, it is killed and
        :class:`Timeout` raised. ``max_output``: the result keeps at most that many bytes of each
        stream (``stdout_truncated``/``stderr_truncated`` say so); the callbacks get all of it."""
        pod = self._pod()
        core = self._sandboxes._core
        return exec_in(core, self.namespace, pod, cmd, stdin, timeout, on_stdout, on_stderr, max_output)

    def start(
        self,
        cmd: str | Sequence[str],
        stdin: bytes | None = None,
        on_stdout: Output | None = None,
        on_stderr: Output | None = None,
        max_output: int | None = None,
    ) -> Execution:
        """Starts ``cmd`` in the background: the :class:`~sandboxrun.exec.Execution` returned
        streams its output to the callbacks, :meth:`~sandboxrun.exec.Execution.wait` returns its
        result, :meth:`~sandboxrun.exec.Execution.kill` ends it. ``max_output``: as in :meth:`run`."""
        core, pod = self._sandboxes._core, self._pod()
        return start_in(core, self.namespace, pod, cmd, stdin, on_stdout, on_stderr, max_output)

    def _checked(
        self, cmd: list[str], stdin: bytes | None, timeout: float, max_output: int | None = None
    ) -> ExecResult:
        result = self.run(cmd, stdin=stdin, timeout=timeout, max_output=max_output)
        if not result.ok:
            raise CommandFailed(cmd, result.exit_code, result.stderr)
        return result

    def write_file(self, path: str, data: bytes | str, timeout: float = 300.0) -> None:
        """Writes ``data`` to ``path`` in the sandbox: ``sh -c 'cat > "$1"' sh PATH`` fed the
        bytes on stdin (through ``head -c``, see :func:`sandboxrun.exec.with_counted_stdin`), so
        the workload image needs ``sh``, ``head`` and ``cat``. The directory must exist and be
        writable by the run's user (a read-back path is)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._checked(["sh", "-c", 'cat > "$1"', "sh", path], raw, timeout)

    def read_file(self, path: str, timeout: float = 300.0, max_bytes: int | None = None) -> bytes:
        """The content of ``path`` in the sandbox (``cat``). With ``max_bytes``, a longer file is
        :class:`SandboxError` after at most ``max_bytes + 1`` bytes were kept (the workload chooses
        the file's size: bound what you read)."""
        limit = None if max_bytes is None else max_bytes + 1
        result = self._checked(["cat", "--", path], None, timeout, limit)
        if result.stdout_truncated or (max_bytes is not None and len(result.stdout_bytes) > max_bytes):
            raise SandboxError(f"{self.namespace}/{self.name}: {path} is larger than {max_bytes} bytes")
        return result.stdout_bytes

    def list_files(self, path: str, timeout: float = 60.0) -> list[FileEntry]:
        """The entries of the directory ``path`` in the sandbox, dot files too, sorted by name; a
        symlink is listed as one, never followed. The image needs ``sh`` and ``stat``. Not a
        directory: :class:`CommandFailed`; a listing over :data:`MAX_LISTING_BYTES`:
        :class:`SandboxError`."""
        result = self._checked(["sh", "-c", LIST_SCRIPT, "sh", path], None, timeout, MAX_LISTING_BYTES)
        if result.stdout_truncated:
            raise SandboxError(f"{self.namespace}/{self.name}: the listing of {path} is over {MAX_LISTING_BYTES} bytes")
        return parse_listing(path, result.stdout_bytes)

    def delete_file(self, path: str, recursive: bool = False, timeout: float = 60.0) -> None:
        """Deletes ``path`` in the sandbox (``rm -f``, with ``recursive`` ``rm -rf``: a directory
        and what it holds; a symlink itself, never its target). A path that does not exist is
        not an error; one that cannot be deleted is :class:`CommandFailed`."""
        self._checked(["rm", "-rf" if recursive else "-f", "--", path], None, timeout)

    def watch(self, path: str, interval: float = 1.0, timeout: float | None = None) -> Iterator[FileEvent]:
        """The changes to the directory ``path`` (created, modified, deleted entries) from now on,
        as they are seen: the directory is listed at once (the changes are against that
        listing), then every ``interval`` seconds (:meth:`list_files`; no image is assumed to
        have inotify tools), each listing compared with the one before. Ends after ``timeout``
        seconds (``None``: when the caller stops iterating); a sandbox that stops running ends it
        with :class:`NotRunning`."""
        seen = {e.name: e for e in self.list_files(path)}
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._changes(path, seen, interval, deadline)

    def _changes(
        self, path: str, seen: dict[str, FileEntry], interval: float, deadline: float | None
    ) -> Iterator[FileEvent]:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
            now = {e.name: e for e in self.list_files(path)}
            yield from changes(seen, now)
            seen = now

    # --- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self, token: str | None = None, timeout: float = 600.0) -> RunFiles:
        """Saves the running sandbox's read-back paths now, without stopping it
        (``spec.checkpoint``, docs/user-guide.md "Checkpoints"), waits until the checkpoint is
        recorded and returns its files (``RunFiles.checkpoint``: its index, what a fork names). ``token``: any new string up to 63 characters (default: one
        made from the time). Raises :class:`~sandboxrun.errors.DrainFailed` when a path failed,
        :class:`SandboxError` when the operator refused the checkpoint (its limit)."""
        token = token or f"cp-{time.time_ns()}"
        body = {"spec": {"checkpoint": token}}
        self._sandboxes._custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name, body)
        obj = self._sandboxes._watch_until(
            self.name, f"to checkpoint {token}", timeout, lambda o: _checkpoint(o, token) is not None
        )
        status = obj.get("status") or {}
        entry = _checkpoint(obj, token) or {}
        if entry.get("message") and not entry.get("readBack"):
            raise SandboxError(f"{self.namespace}/{self.name}: {entry['message']}")
        saved = RunStatus.from_dict({"phase": status.get("phase"), "readBack": entry.get("readBack", [])})
        if saved.failed_paths:
            check_drain(self.name, saved, self.drain_failed_note())
        index = entry.get("index")
        return RunFiles(
            self.name,
            saved,
            self._sandboxes.store,
            self.namespace,
            self.uid,
            checkpoint=index if isinstance(index, int) else None,
        )

    # --- the end -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks the operator to tear the run down (``spec.stop: true``): drain, then release. A
        run already deleted is left alone."""
        body = {"spec": {"stop": True}}
        try:
            self._sandboxes._custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name, body
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def drain_failed_note(self) -> str | None:
        """The note of the run's ``sandbox_runfiles_drain_failed`` Event, if there is one."""
        selector = f"involvedObject.name={self.name},involvedObject.kind={KIND},reason={DRAIN_FAILED_REASON}"
        try:
            events = self._sandboxes._core.list_namespaced_event(self.namespace, field_selector=selector).items
        except ApiException as e:
            if e.status in (401, 403):
                return None  # not allowed to list Events: the status alone says which paths failed
            raise
        uid_events = [e for e in events if e.involved_object.uid in (None, self.uid)]
        return uid_events[-1].message if uid_events else None

    def wait_drained(self, timeout: float = 600.0) -> RunFiles:
        """Waits until the run ended and every read-back path has an outcome. Raises
        :class:`~sandboxrun.errors.DrainFailed` (with the failed paths, their messages and the
        Event's note) when a path failed; an ``Empty`` path is a success with no file."""
        status = self._wait("to end and drain", timeout, lambda s: s.drain_settled)
        if status.failed_paths:
            check_drain(self.name, status, self.drain_failed_note())
        return RunFiles(self.name, status, self._sandboxes.store, self.namespace, self.uid)

    def files(self, attempt: int | None = None, checkpoint: int | None = None) -> RunFiles:
        """The drained files of a run that has ended (see :meth:`wait_drained`); with ``attempt``,
        the files that attempt left (an earlier attempt of a retried run, or the latest);
        with ``checkpoint``, the files checkpoint ``checkpoint`` saved (its index in
        ``status.checkpoints[]``), readable while the run still runs."""
        obj = self._sandboxes._get(self.name)
        raw = generation_status(self.name, obj.get("status") or {}, attempt, checkpoint)
        status = RunStatus.from_dict(raw)
        if not status.drain_settled:
            raise SandboxError(f"{self.namespace}/{self.name} has not drained yet (phase {status.phase})")
        return RunFiles(self.name, status, self._sandboxes.store, self.namespace, self.uid)

    def delete(self) -> None:
        """Deletes the run (its files stay in the store unless its retention is ``Delete``)."""
        try:
            self._sandboxes._custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        except ApiException as e:
            if e.status != 404:
                raise


class Sandboxes:
    """SandboxRuns of one namespace, with the caller's own credentials (see :mod:`sandboxrun.kube`).

    ``store`` reads the drained files back; by default a :class:`StoreReader` with boto3's
    environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``)."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        api_client: client.ApiClient | None = None,
        store: StoreReader | None = None,
    ) -> None:
        if api_client is None:
            api_client, default_ns = connect(kubeconfig, context)
        else:
            default_ns = "default"
        self.namespace = namespace or default_ns
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self.store = store or StoreReader()

    def create(
        self,
        *,
        template: str | None = None,
        template_kind: str = "SandboxRunTemplate",
        name: str | None = None,
        generate_name: str = "sandbox-",
        spec: Mapping[str, Any] | None = None,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        workspace_restore: str | None = None,
        fork_from: str | tuple[str, int] | None = None,
        fork_checkpoint: int | None = None,
    ) -> Sandbox:
        """Creates a run: from ``template`` (``spec.templateRef``; set only the fields it leaves
        open) and/or a ``spec``. Without a ``command`` the run is a long-lived sandbox driven by
        :meth:`Sandbox.run` until :meth:`Sandbox.stop`.

        ``workspace_restore="Latest"`` (``spec.workspace.restore``): each later attempt — after
        :meth:`Sandbox.pause` and :meth:`Sandbox.resume`, or a retry — starts with the files the
        one before left. ``fork_from="run"`` or ``("run", attempt)`` (``spec.workspace.from``):
        the run starts with that run's saved files (same namespace and store; you need ``get`` on
        it). ``fork_from="run", fork_checkpoint=n``: from that run's checkpoint ``n`` instead (it
        may keep running; ``status.checkpoints``). Both need a ``command`` (the operator starts it
        once the files are in place)."""
        body_spec: dict[str, Any] = dict(spec or {})
        if template:
            body_spec["templateRef"] = {"name": template, "kind": template_kind}
        if command is not None:
            body_spec["command"] = list(command)
        if env:
            body_spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
        workspace = _workspace(workspace_restore, fork_from, fork_checkpoint)
        if workspace:
            body_spec["workspace"] = workspace
        metadata: dict[str, Any] = {"name": name} if name else {"generateName": generate_name}
        if labels:
            metadata["labels"] = dict(labels)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": body_spec}
        obj = self._custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        return Sandbox(self, cast(Mapping[str, Any], obj))

    def get(self, name: str) -> Sandbox:
        """The run ``name`` of the namespace (the apiserver's 404 as ``ApiException`` if none)."""
        return Sandbox(self, self._get(name))

    def list(
        self,
        *,
        template: str | None = None,
        template_kind: str | None = None,
        labels: Mapping[str, str] | None = None,
        phase: str | Sequence[str] | None = None,
    ) -> list[Sandbox]:
        """The namespace's runs: made from ``template`` (its ``spec.templateRef``; and of
        ``template_kind`` when given), carrying every one of ``labels`` (asked of the apiserver as
        a label selector), in ``phase`` (one or several). Read page by page."""
        phases = {phase} if isinstance(phase, str) else set(phase or ())
        selector = label_selector(labels) if labels else None
        found: list[Sandbox] = []
        token: str | None = None
        while True:
            page = cast(Mapping[str, Any], self._list_page(selector, token))
            for obj in page.get("items") or []:
                ref = (obj.get("spec") or {}).get("templateRef") or {}
                if template is not None and ref.get("name") != template:
                    continue
                if template_kind is not None and ref.get("kind") != template_kind:
                    continue
                if phases and RunStatus.from_dict(obj.get("status")).phase not in phases:
                    continue
                found.append(Sandbox(self, obj))
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return found

    def _list_page(self, selector: str | None, token: str | None) -> Any:
        kwargs: dict[str, Any] = {"limit": _LIST_PAGE}
        if selector:
            kwargs["label_selector"] = selector
        if token:
            kwargs["_continue"] = token
        return self._custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, **kwargs)

    def _watch_until(
        self, name: str, what: str, timeout: float, done: Callable[[Mapping[str, Any]], bool]
    ) -> Mapping[str, Any]:
        """Reads the run once, then WATCHES it (``watch.Watch`` on its name, from the version
        read) until ``done`` holds: no polling. A watch that ends or expires is re-opened after
        a fresh read; :class:`Timeout` past ``timeout`` with what was seen last; a run deleted
        meanwhile is a :class:`SandboxError`."""
        deadline = time.monotonic() + timeout
        obj = self._get(name)
        while not done(obj):
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{self.namespace}/{name} {what}", timeout, _last_seen(obj))
            obj = self._watch_once(name, obj, left, done)
            if not done(obj) and time.monotonic() < deadline:
                time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))
                obj = self._get(name)
        return obj

    def _watch_once(
        self, name: str, obj: Mapping[str, Any], left: float, done: Callable[[Mapping[str, Any]], bool]
    ) -> Mapping[str, Any]:
        seconds = max(1, min(int(left) + 1, _WATCH_PERIOD))
        kwargs: dict[str, Any] = {"field_selector": f"metadata.name={name}", "timeout_seconds": seconds}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            kwargs["resource_version"] = version
        watcher = watch.Watch()
        try:
            for event in watcher.stream(
                self._custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, **kwargs
            ):
                if event.get("type") == "DELETED":
                    raise SandboxError(f"{self.namespace}/{name} was deleted (last seen: {_last_seen(obj)})")
                if event.get("type") in ("ADDED", "MODIFIED"):
                    obj = cast(Mapping[str, Any], event["raw_object"])
                    if done(obj):
                        return obj
        except ApiException as e:
            if e.status != 410:
                raise  # 410: the version expired; the caller reads the run anew
        finally:
            watcher.stop()
        return obj

    def _get(self, name: str) -> Mapping[str, Any]:
        obj = self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        return cast(Mapping[str, Any], obj)
