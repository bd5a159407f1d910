"""Reading drained files back from Google Cloud Storage (``gs://``) and Azure Blob Storage
(``az://``), through the official libraries, against the bed's emulators (fake-gcs-server and
Azurite, hack/store-emulators.sh): the store is distrusted there as on S3 and ``file://``."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import manifest_doc, tar_of

from sandboxrun import RunFiles, StoreReader
from sandboxrun.clouds import AzureSettings, GcsSettings, azure_client, gcs_client
from sandboxrun.errors import StoreError, UnsafeArchive
from sandboxrun.status import RunStatus

pytestmark = pytest.mark.bed

Put = Callable[[str, bytes], None]
FILES = {"notes.txt": b"kept\n", "big.bin": bytes(range(256)) * 4096}


def _gcs() -> tuple[StoreReader, str, Put]:
    endpoint = os.environ["SANDBOXRUN_TEST_GCS_ENDPOINT"]
    bucket_name = os.environ["SANDBOXRUN_TEST_GCS_BUCKET"]
    settings = GcsSettings(endpoint=endpoint)
    reader = StoreReader(gcs=settings)
    bucket = gcs_client(settings).bucket(bucket_name)
    return reader, f"gs://{bucket_name}", lambda key, data: bucket.blob(key).upload_from_string(data)


def _azure() -> tuple[StoreReader, str, Put]:
    settings = AzureSettings(
        account=os.environ["SANDBOXRUN_TEST_AZURE_ACCOUNT"],
        key=os.environ["SANDBOXRUN_TEST_AZURE_KEY"],
        account_url=os.environ["SANDBOXRUN_TEST_AZURE_ENDPOINT"],
    )
    container = os.environ["SANDBOXRUN_TEST_AZURE_CONTAINER"]
    reader = StoreReader(azure=settings)
    service = azure_client(settings)
    return reader, f"az://{container}", lambda key, data: service.get_blob_client(container, key).upload_blob(
        data, overwrite=True
    )


STORES = {"gcs": _gcs, "azure": _azure}


def _run_files(reader: StoreReader, root: str, put: Put, archive: bytes, doc_files: dict[str, bytes]) -> RunFiles:
    """A committed path of run ``ns/job`` (uid ``u-1``) under a fresh prefix of the store."""
    prefix = f"py-{uuid.uuid4().hex[:8]}/ns/job/u-1/checkpoint-1"
    doc = manifest_doc(doc_files, f"{prefix}/00-work-out.tar")
    put(f"{prefix}/00-work-out.tar", archive)
    put(f"{prefix}/00-work-out.manifest.json", json.dumps(doc).encode())
    entry = {"path": "/work/out", "phase": "Drained", "manifest": f"{root}/{prefix}/00-work-out.manifest.json"}
    return RunFiles("job", RunStatus.from_dict({"phase": "Stopped", "readBack": [entry]}), reader, "ns", "u-1")


@pytest.mark.parametrize("store", sorted(STORES))
def test_drained_files_are_listed_fetched_and_extracted_from_the_store(store: str, tmp_path: Path) -> None:
    reader, root, put = STORES[store]()
    files = _run_files(reader, root, put, tar_of([(n, c, None) for n, c in FILES.items()]), FILES)
    stored = {f.path: f for f in files.files()}
    assert {p: f.size for p, f in stored.items()} == {p: len(c) for p, c in FILES.items()}
    assert stored["big.bin"].archive_url.startswith(root + "/")
    assert files.fetch(stored["notes.txt"]) == b"kept\n"
    assert files.fetch(stored["big.bin"], max_bytes=10) == FILES["big.bin"][:10], "the first bytes, the whole checked"
    (out,) = files.download(tmp_path)
    assert (out / "big.bin").read_bytes() == FILES["big.bin"]


@pytest.mark.parametrize("store", sorted(STORES))
def test_an_archive_that_differs_from_its_manifest_is_refused(store: str) -> None:
    reader, root, put = STORES[store]()
    tampered = tar_of([("notes.txt", b"forged", None), ("big.bin", FILES["big.bin"], None)])
    files = _run_files(reader, root, put, tampered, FILES)
    notes = next(f for f in files.files() if f.path == "notes.txt")
    with pytest.raises(UnsafeArchive):
        files.fetch(notes)


@pytest.mark.parametrize("store", sorted(STORES))
def test_an_object_the_store_does_not_hold_is_a_store_error(store: str) -> None:
    reader, root, _ = STORES[store]()
    with pytest.raises(StoreError):
        reader.get(f"{root}/py-none/{uuid.uuid4().hex}")
