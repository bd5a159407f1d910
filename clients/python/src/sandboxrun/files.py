"""Reading a run's drained files back from its store: the manifests and archives the status
names (``status.readBack[].manifest``), on a ``file://`` directory or S3 (``boto3``, with the
endpoint and credentials you pass, else boto3's own environment: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, …)."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

from . import archive
from .errors import StoreError, UnsafeArchive
from .manifest import Manifest, parse_manifest
from .status import PathStatus, RunStatus, check_drain

MANIFEST_SUFFIX = ".manifest.json"


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
    """Reads objects by URL: ``file:///dir/key`` or ``s3://bucket/key``. S3 settings are passed
    in (``endpoint_url``, ``access_key``, ``secret_key``, ``region``); what is not passed comes
    from boto3's environment, as with any boto3 client."""

    def __init__(
        self,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
        s3_client: Any = None,
    ) -> None:
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

    def get(self, url: str) -> bytes:
        """The whole object at ``url``."""
        scheme, bucket, key = split_url(url)
        if scheme == "file":
            try:
                return Path(key).read_bytes()
            except OSError as e:
                raise StoreError(f"{url}: {e}") from e
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self._s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except (BotoCoreError, ClientError) as e:
            raise StoreError(f"{url}: {e}") from e

    @contextmanager
    def open(self, url: str) -> Iterator[IO[bytes]]:
        """The object at ``url`` as a stream (an archive is never read into memory whole)."""
        scheme, bucket, key = split_url(url)
        if scheme == "file":
            try:
                stream: IO[bytes] = Path(key).open("rb")  # noqa: SIM115 (closed below, after the yield)
            except OSError as e:
                raise StoreError(f"{url}: {e}") from e
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


def split_url(url: str) -> tuple[str, str, str]:
    """(scheme, bucket, key) of an object URL; for ``file://`` the key is the local path."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return "file", "", unquote(parsed.path)
    if parsed.scheme == "s3":
        key = unquote(parsed.path.lstrip("/"))
        if not parsed.netloc or not key:
            raise StoreError(f"{url}: not s3://<bucket>/<key>")
        return "s3", parsed.netloc, key
    raise StoreError(f"{url}: this client reads file:// and s3:// stores (not {parsed.scheme or 'a bare path'})")


def archive_url(manifest_url: str, manifest: Manifest) -> str:
    """The URL of the archive ``manifest`` commits. Its ``archiveKey`` is the key from the store's
    root: on S3 that is the bucket's key; on ``file://`` the root is the manifest's URL less the
    manifest's own key, which lies beside the archive."""
    scheme, bucket, key = split_url(manifest_url)
    if scheme == "s3":
        return f"s3://{bucket}/{manifest.archive_key}"
    manifest_key = posixpath.join(posixpath.dirname(manifest.archive_key), posixpath.basename(key))
    if not key.endswith("/" + manifest_key):
        raise StoreError(f"{manifest_url}: its archiveKey {manifest.archive_key!r} is not beside it")
    root = key[: -len(manifest_key)]
    return "file://" + root + manifest.archive_key


class RunFiles:
    """What a finished run left in its store, read through a :class:`StoreReader`."""

    def __init__(self, run: str, status: RunStatus, reader: StoreReader) -> None:
        # A failed drain is never an empty set: refuse to list a run that has one.
        check_drain(run, status)
        self.run = run
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
                manifest = parse_manifest(self.reader.get(entry.manifest))
                self._paths.append(StoredPath(entry, manifest, archive_url(entry.manifest, manifest)))
        return self._paths

    def files(self) -> list[StoredFile]:
        """Every stored regular file of every path, in declared order."""
        return [f for p in self.paths() for f in p.files]

    def fetch(self, stored: StoredFile) -> bytes:
        """The content of ``stored``, checked against the manifest's sha256."""
        with self.reader.open(stored.archive_url) as raw:
            content = archive.read_file(archive.open_tar_stream(raw, stored.compression), stored.path)
        if content is None:
            raise StoreError(f"{stored.archive_url}: no member {stored.path!r}, though the manifest lists it")
        digest = hashlib.sha256(content).hexdigest()
        if stored.sha256 is not None and digest != stored.sha256:
            raise UnsafeArchive(f"{stored.container_path}: sha256 {digest} differs from the manifest's {stored.sha256}")
        return content

    def download(self, dest: Path) -> list[Path]:
        """Extracts every committed path into ``dest/<NN>-<slug>/`` (as ``files get`` does),
        safely and verified against its manifest; returns the directories."""
        out: list[Path] = []
        for stored in self.paths():
            name = posixpath.basename(stored.status.manifest or "")[: -len(MANIFEST_SUFFIX)]
            target = Path(dest) / name
            with self.reader.open(stored.archive_url) as raw:
                archive.extract(archive.open_tar_stream(raw, stored.manifest.compression), target, stored.manifest)
            out.append(target)
        return out
