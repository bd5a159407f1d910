"""Opening objects of Google Cloud Storage (``gs://bucket/key``) and Azure Blob Storage
(``az://container/key``) as streams, for :class:`sandboxrun.files.StoreReader`: the official
libraries (``google-cloud-storage``, ``azure-storage-blob``: the ``[gcs]`` and ``[azure]``
extras), imported only when such a URL is read. Each stream reads in chunks of
:data:`CHUNK_BYTES` (an archive is never held whole) and announces the object's size."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import IO, Any

from .errors import StoreError

#: The bytes one ranged read fetches (the libraries' defaults are 40 MiB for GCS and 4 MiB for
#: Azure's first request).
CHUNK_BYTES = 1 << 20
#: The Azure Blob API version asked for by default: one Azurite (the emulator) serves too.
AZURE_API_VERSION = "2025-01-05"


@dataclass
class GcsSettings:
    """How to reach GCS: a ``storage.Client`` of yours, or an ``endpoint`` (an emulator's) with
    anonymous credentials, else the environment's (Application Default Credentials)."""

    client: Any = None
    endpoint: str | None = None
    project: str | None = None


@dataclass
class AzureSettings:
    """How to reach Azure Blob Storage: a ``BlobServiceClient`` of yours, or an account (its
    ``account_url``, default ``https://<account>.blob.core.windows.net``) and key, else the
    ``AZURE_STORAGE_CONNECTION_STRING`` environment variable."""

    client: Any = None
    account: str | None = None
    key: str | None = None
    account_url: str | None = None
    api_version: str = AZURE_API_VERSION


class _Sized(io.RawIOBase):
    """A readable stream that knows the object's size (``_content_length``, as boto3's body)."""

    def __init__(self, read: Any, size: int | None) -> None:
        self._read = read
        self._content_length = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._read(len(buffer))
        except Exception as e:  # noqa: BLE001 - the library's own errors, as a stream's
            raise OSError(f"the store's read failed: {e}") from e
        buffer[: len(data)] = data
        return len(data)


def open_gcs(settings: GcsSettings, url: str, bucket: str, key: str) -> IO[bytes]:
    try:
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError
    except ImportError as e:
        raise StoreError(f"{url}: reading gs:// needs google-cloud-storage (pip install 'sandboxrun[gcs]')") from e
    try:
        blob = gcs_client(settings).bucket(bucket).get_blob(key)
        if blob is None:
            raise StoreError(f"{url}: no such object")
        reader = blob.open("rb", chunk_size=CHUNK_BYTES)
    except (GoogleAPIError, GoogleAuthError) as e:
        raise StoreError(f"{url}: {e}") from e
    return io.BufferedReader(_Sized(reader.read, blob.size), CHUNK_BYTES)


def gcs_client(settings: GcsSettings) -> Any:
    """The settings' GCS client, made on first use and kept in them."""
    if settings.client is None:
        settings.client = _new_gcs_client(settings)
    return settings.client


def _new_gcs_client(settings: GcsSettings) -> Any:
    from google.cloud import storage

    if settings.endpoint:
        from google.auth.credentials import AnonymousCredentials

        options = {"api_endpoint": settings.endpoint}
        return storage.Client(project=settings.project or "-", credentials=AnonymousCredentials(), client_options=options)
    return storage.Client(project=settings.project)


def open_azure(settings: AzureSettings, url: str, container: str, key: str) -> IO[bytes]:
    try:
        from azure.core.exceptions import AzureError
    except ImportError as e:
        raise StoreError(f"{url}: reading az:// needs azure-storage-blob (pip install 'sandboxrun[azure]')") from e
    try:
        download = azure_client(settings).get_blob_client(container, key).download_blob(max_concurrency=1)
    except (AzureError, ValueError) as e:
        raise StoreError(f"{url}: {e}") from e
    return io.BufferedReader(_Sized(download.read, download.size), CHUNK_BYTES)


def azure_client(settings: AzureSettings) -> Any:
    """The settings' ``BlobServiceClient``, made on first use and kept in them."""
    if settings.client is None:
        settings.client = _new_azure_client(settings)
    return settings.client


def _new_azure_client(settings: AzureSettings) -> Any:
    import os

    from azure.storage.blob import BlobServiceClient

    common: dict[str, Any] = {
        "api_version": settings.api_version,
        "max_single_get_size": CHUNK_BYTES,
        "max_chunk_get_size": CHUNK_BYTES,
    }
    if settings.account and settings.key:
        url = settings.account_url or f"https://{settings.account}.blob.core.windows.net"
        credential = {"account_name": settings.account, "account_key": settings.key}
        return BlobServiceClient(account_url=url, credential=credential, **common)
    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if not connection:
        raise StoreError("az://: no Azure account and key given, and no AZURE_STORAGE_CONNECTION_STRING")
    return BlobServiceClient.from_connection_string(connection, **common)
