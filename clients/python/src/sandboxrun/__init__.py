"""A Python client for SandboxRuns (``sandbox.iterion.io/v1alpha1``): run untrusted commands in
a sandbox and read back the files it left, with typed errors for a drain that failed."""

from .aio import AsyncExecution, AsyncSandbox, AsyncSandboxes
from .client import Sandbox, Sandboxes
from .errors import (
    CommandFailed,
    DrainFailed,
    ExecError,
    FailedPath,
    NotRunning,
    RunFailed,
    SandboxError,
    StoreError,
    Timeout,
    UnsafeArchive,
)
from .exec import ExecResult, Execution
from .files import RunFiles, StoredFile, StoreReader
from .manifest import Manifest, Member, parse_manifest
from .status import PathStatus, RunStatus
from .workspace import FileEntry, FileEvent

__all__ = [
    "AsyncExecution",
    "AsyncSandbox",
    "AsyncSandboxes",
    "CommandFailed",
    "DrainFailed",
    "ExecError",
    "ExecResult",
    "Execution",
    "FailedPath",
    "FileEntry",
    "FileEvent",
    "Manifest",
    "Member",
    "NotRunning",
    "PathStatus",
    "RunFailed",
    "RunFiles",
    "RunStatus",
    "Sandbox",
    "SandboxError",
    "Sandboxes",
    "StoreError",
    "StoreReader",
    "StoredFile",
    "Timeout",
    "UnsafeArchive",
    "parse_manifest",
]
