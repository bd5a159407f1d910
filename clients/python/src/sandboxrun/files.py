"""Reading a run's drained files back from its store: the manifests and archives the status
names (``status.readBack[].manifest``), on a ``file://`` directory, S3 (``boto3``, with the
endpoint and credentials you pass, else boto3's own environment: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, …), Google Cloud Storage or Azure Blob Storage (:mod:`sandboxrun.clouds`)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

from . import archive
from .clouds import AzureSettings, GcsSettings, open_azure, open_gcs
from .errors import StoreError, UnsafeArchive
from .manifest import EXTENSIONS, Manifest, parse_manifest
from .status import PathStatus, RunStatus, check_drain

MANIFEST_SUFFIX = ".manifest.json"
#: The largest manifest read (the operator's own bound, ``MAX_MANIFEST_BYTES`` in
#: src/store/manifest.rs: 2 x 32 MiB + 16 MiB). Whoever holds the store's credentials can put
#: anything at a manifest key: a larger object is refused unread (docs/contract.md, "The Python
#: client distrusts the store").
MAX_MANIFEST_BYTES = 2 * 32 * 1024 * 1024 + 16 * 1024 * 1024
#: ``<NN>-<slug>``: the name of a path's objects (src/store/keys.rs ``object_keys``).
_STEM = re.compile(r"[0-9]{2,}-[A-Za-z0-9._-]{1,64}")
#: The schemes whose URLs name a bucket (or container) and a key in it.
BUCKET_SCHEMES = ("s3", "gs", "az")
#: A generation directory below the run's uid (``attempt-<N>``, ``checkpoint-<N>``).
_GENERATION = re.compile(r"(attempt|checkpoint)-[0-9]+")


@dataclass(frozen=True)
class StoredFile:
    """A regular file of a drained path: ``path`` is relative to ``declared_path``."""

    declared_path: str
    path: str
    size: int
    sha256: str | None
    archive_url: str
    compression: str

    @property
    def container_path(self) -> str:
        """Where the workload wrote it."""
        return posixpath.join(self.declared_path, self.path)


@dataclass(frozen=True)
class StoredPath:
    """A committed read-back path: its status entry, manifest and archive URL."""

    status: PathStatus
    manifest: Manifest
    archive_url: str

    @property
    def files(self) -> list[StoredFile]:
        return [
            StoredFile(
                self.manifest.declared_path, m.path, m.size, m.sha256, self.archive_url, self.manifest.compression
            )
            for m in self.manifest.files
        ]


class StoreReader:
    """Reads objects by URL: ``file:///dir/key``, ``s3://bucket/key``, ``gs://bucket/key`` or
    ``az://container/key``. S3 settings are passed in (``endpoint_url``, ``access_key``,
    ``secret_key``, ``region``); what is not passed comes from boto3's environment, as with any
    boto3 client. ``gcs`` and ``azure`` say how to reach those (:class:`~sandboxrun.clouds.GcsSettings`,
    :class:`~sandboxrun.clouds.AzureSettings`; by default their environments')."""

    def __init__(
        self,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
        s3_client: Any = None,
        gcs: GcsSettings | None = None,
        azure: AzureSettings | None = None,
    ) -> None:
        self._gcs = gcs or GcsSettings()
        self._azure = azure or AzureSettings()
        self._endpoint_url = endpoint_url
        self._access_key = access_key
        self._secret_key = secret_key
        self._region = region
        self._s3 = s3_client

    def _s3_client(self) -> Any:
        if self._s3 is None:
            import boto3
            from botocore.config import Config

            self._s3 = boto3.client(
                "s3",
                endpoint_url=self._endpoint_url,
                aws_access_key_id=self._access_key,
                aws_secret_access_key=self._secret_key,
                region_name=self._region,
                # Path-style works with every S3 server (s3s-fs, MinIO) and with AWS.
                config=Config(s3={"addressing_style": "path"}),
            )
        return self._s3

    def get(self, url: str, max_bytes: int | None = None) -> bytes:
        """The whole object at ``url``; with ``max_bytes``, an object larger than that is refused
        (by its announced size before a byte is read, and the read stops one byte past it)."""
        with self.open(url) as stream:
            size = _announced_size(stream)
            if max_bytes is not None and size is not None and size > max_bytes:
                raise StoreError(f"{url}: {size} bytes, more than the {max_bytes} this client reads")
            try:
                body = stream.read() if max_bytes is None else stream.read(max_bytes + 1)
            except OSError as e:
                raise StoreError(f"{url}: {e}") from e
        if max_bytes is not None and len(body) > max_bytes:
            raise StoreError(f"{url}: more than the {max_bytes} bytes this client reads")
        return body

    @contextmanager
    def open(self, url: str) -> Iterator[IO[bytes]]:
        """The object at ``url`` as a stream (an archive is never read into memory whole)."""
        scheme, bucket, key = split_url(url)
        if scheme == "file":
            try:
                stream: IO[bytes] = Path(key).open("rb")  # noqa: SIM115 (closed below, after the yield)
            except OSError as e:
                raise StoreError(f"{url}: {e}") from e
        elif scheme == "gs":
            stream = open_gcs(self._gcs, url, bucket, key)
        elif scheme == "az":
            stream = open_azure(self._azure, url, bucket, key)
        else:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                stream = self._s3_client().get_object(Bucket=bucket, Key=key)["Body"]
            except (BotoCoreError, ClientError) as e:
                raise StoreError(f"{url}: {e}") from e
        try:
            yield stream
        finally:
            stream.close()


def _announced_size(stream: IO[bytes]) -> int | None:
    """The size the store announces for an opened object (a local file's ``fstat``, S3's
    ``Content-Length``), if it says one."""
    fileno = getattr(stream, "fileno", None)
    if fileno is not None:
        try:
            import os

            return os.fstat(fileno()).st_size
        except (OSError, ValueError):
            return None
    length = getattr(stream, "_content_length", None)
    try:
        return int(length) if length is not None else None
    except (TypeError, ValueError):
        return None


def split_url(url: str) -> tuple[str, str, str]:
    """(scheme, bucket, key) of an object URL; for ``file://`` the key is the local path."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return "file", "", unquote(parsed.path)
    if parsed.scheme in BUCKET_SCHEMES:
        key = unquote(parsed.path.lstrip("/"))
        if not parsed.netloc or not key:
            raise StoreError(f"{url}: not {parsed.scheme}://<bucket>/<key>")
        return parsed.scheme, parsed.netloc, key
    raise StoreError(f"{url}: this client reads file://, s3://, gs:// and az:// stores (not {parsed.scheme or 'a bare path'})")


def _run_dir_check(url: str, key_dir: str, manifest: Manifest, run: RunRef) -> None:
    """Refuses a manifest that is not the run's own: its key must lie in the run's directory
    (``…/<namespace>/<name>/<uid>[/attempt-N|checkpoint-N]``, src/store/keys.rs) and its ``run``
    must be the run's."""
    if (manifest.namespace, manifest.run, manifest.uid) != (
        run.namespace or manifest.namespace,
        run.name,
        run.uid or manifest.uid,
    ):
        raise StoreError(
            f"{url}: the manifest is run {manifest.namespace}/{manifest.run} ({manifest.uid}), not "
            f"{run.namespace or '*'}/{run.name} ({run.uid or '*'}): refused"
        )
    parts = key_dir.split("/")
    if parts and _GENERATION.fullmatch(parts[-1]):
        parts = parts[:-1]
    if parts[-3:] != [manifest.namespace, manifest.run, manifest.uid]:
        raise StoreError(f"{url}: not in the directory of run {manifest.namespace}/{manifest.run}/{manifest.uid}: refused")


def archive_url(manifest_url: str, manifest: Manifest, run: RunRef | None = None) -> str:
    """The URL of the archive ``manifest`` commits. Its ``archiveKey`` is the key from the store's
    root: on S3 that is the bucket's key; on ``file://`` the root is the manifest's URL less the
    manifest's own key, which lies beside the archive. The store is not trusted (docs/contract.md
    "The Python client distrusts the store"): the archive must be the manifest's own —
    ``<NN>-<slug>.<ext>`` beside it, in the run's directory — never another run's object."""
    scheme, bucket, key = split_url(manifest_url)
    key_dir, key_name = posixpath.split(key)
    stem = key_name[: -len(MANIFEST_SUFFIX)] if key_name.endswith(MANIFEST_SUFFIX) else ""
    if not _STEM.fullmatch(stem):
        raise StoreError(f"{manifest_url}: not a manifest's name (<NN>-<slug>{MANIFEST_SUFFIX})")
    _run_dir_check(manifest_url, key_dir, manifest, run or RunRef(manifest.run))
    archive_dir, archive_name = posixpath.split(manifest.archive_key)
    if archive_name != f"{stem}.{EXTENSIONS[manifest.compression]}" or "\\" in manifest.archive_key:
        raise StoreError(f"{manifest_url}: its archiveKey {manifest.archive_key!r} is not its own archive")
    if scheme in BUCKET_SCHEMES:
        if archive_dir != key_dir:
            raise StoreError(f"{manifest_url}: its archiveKey {manifest.archive_key!r} is not beside it")
        return f"{scheme}://{bucket}/{manifest.archive_key}"
    if any(p in ("", ".", "..") for p in manifest.archive_key.split("/")) or not key_dir.endswith("/" + archive_dir):
        raise StoreError(f"{manifest_url}: its archiveKey {manifest.archive_key!r} is not beside it")
    return "file://" + key_dir + "/" + archive_name


@dataclass(frozen=True)
class RunRef:
    """The run whose files are read: its name, and its namespace and uid when known."""

    name: str
    namespace: str | None = None
    uid: str | None = None


class RunFiles:
    """What a finished run left in its store, read through a :class:`StoreReader`."""

    def __init__(
        self,
        run: str,
        status: RunStatus,
        reader: StoreReader,
        namespace: str | None = None,
        uid: str | None = None,
        checkpoint: int | None = None,
    ) -> None:
        # A failed drain is never an empty set: refuse to list a run that has one.
        check_drain(run, status)
        self.run = run
        #: The checkpoint's index (``status.checkpoints[].index``) when these are a checkpoint's
        #: files: what ``create(fork_from=run, fork_checkpoint=…)`` names.
        self.checkpoint = checkpoint
        self._ref = RunRef(run, namespace, uid)
        self.status = status
        self.reader = reader
        self._paths: list[StoredPath] | None = None

    def paths(self) -> list[StoredPath]:
        """Every committed path (an ``Empty`` one too: its manifest lists no member)."""
        if self._paths is None:
            self._paths = []
            for entry in self.status.read_back:
                if not entry.stored or entry.manifest is None:
                    continue
                manifest = parse_manifest(self.reader.get(entry.manifest, MAX_MANIFEST_BYTES))
                url = archive_url(entry.manifest, manifest, self._ref)
                self._paths.append(StoredPath(entry, manifest, url))
        return self._paths

    def files(self) -> list[StoredFile]:
        """Every stored regular file of every path, in declared order."""
        return [f for p in self.paths() for f in p.files]

    def fetch(self, stored: StoredFile, max_bytes: int | None = None) -> bytes:
        """The content of ``stored``, checked against the manifest's sha256 (and size). With
        ``max_bytes``, only its first ``max_bytes`` bytes are returned, but the whole member is
        still read and checked: memory stays bounded whatever the archive says its size is."""
        with self.reader.open(stored.archive_url) as raw:
            read = archive.read_member(archive.open_tar_stream(raw, stored.compression), stored.path, max_bytes)
        if read is None:
            raise StoreError(f"{stored.archive_url}: no member {stored.path!r}, though the manifest lists it")
        if stored.sha256 is not None and read.sha256 != stored.sha256:
            raise UnsafeArchive(
                f"{stored.container_path}: sha256 {read.sha256} differs from the manifest's {stored.sha256}"
            )
        if read.size != stored.size:
            raise UnsafeArchive(f"{stored.container_path}: {read.size} bytes, the manifest says {stored.size}")
        return read.head

    def download(self, dest: Path) -> list[Path]:
        """Extracts every committed path into ``dest/<NN>-<slug>/`` (as ``files get`` does),
        safely and verified against its manifest; returns the directories."""
        out: list[Path] = []
        for stored in self.paths():
            name = posixpath.basename(stored.status.manifest or "")[: -len(MANIFEST_SUFFIX)]
            if not _STEM.fullmatch(name) or name in (".", ".."):
                raise StoreError(f"{stored.status.manifest}: not a manifest's name: refused")
            target = Path(dest) / name
            with self.reader.open(stored.archive_url) as raw:
                archive.extract(archive.open_tar_stream(raw, stored.manifest.compression), target, stored.manifest)
            out.append(target)
        return out
