"""The exec's exit code from its error channel, and where a manifest's archive lives."""

import json
from pathlib import Path

import pytest
from helpers import manifest_json, tar_of

from sandboxrun import ExecError, RunFiles, RunStatus, StoreError, StoreReader, parse_manifest
from sandboxrun.exec import as_command, exit_code_of
from sandboxrun.files import archive_url, split_url


def test_success_is_exit_code_zero() -> None:
    assert exit_code_of(json.dumps({"metadata": {}, "status": "Success"})) == 0


def test_a_non_zero_exit_code_is_read_from_its_cause() -> None:
    status = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "message": "command terminated with non-zero exit code",
        "details": {"causes": [{"reason": "ExitCode", "message": "42"}]},
    }
    assert exit_code_of(json.dumps(status)) == 42


@pytest.mark.parametrize("channel", ["", "not json", json.dumps({"status": "Failure", "message": "no such file"})])
def test_an_exec_that_did_not_run_is_an_exec_error(channel: str) -> None:
    with pytest.raises(ExecError):
        exit_code_of(channel)


def test_a_string_command_goes_through_sh() -> None:
    assert as_command("echo hi") == ["sh", "-c", "echo hi"]
    assert as_command(["cat", "x"]) == ["cat", "x"]


def test_s3_archive_keys_are_bucket_keys() -> None:
    m = parse_manifest(manifest_json({}, "prefix/ns/job/u-1/00-work-out.tar"))
    assert (
        archive_url("s3://bkt/prefix/ns/job/u-1/00-work-out.manifest.json", m)
        == "s3://bkt/prefix/ns/job/u-1/00-work-out.tar"
    )


def test_file_archive_keys_are_relative_to_the_store_directory() -> None:
    m = parse_manifest(manifest_json({}, "ns/job/u-1/00-work-out.tar.gz", "gzip"))
    assert (
        archive_url("file:///var/store/ns/job/u-1/00-work-out.manifest.json", m)
        == "file:///var/store/ns/job/u-1/00-work-out.tar.gz"
    )


def test_an_archive_key_elsewhere_than_beside_its_manifest_is_refused() -> None:
    m = parse_manifest(manifest_json({}, "other/ns/job/u-9/00-work-out.tar"))
    with pytest.raises(StoreError, match="beside"):
        archive_url("file:///var/store/ns/job/u-1/00-work-out.manifest.json", m)


@pytest.mark.parametrize("url", ["abfs://b/k", "/plain/path", "s3://bucket-only", "gs://bucket-only", "az://"])
def test_unknown_urls_are_store_errors(url: str) -> None:
    with pytest.raises(StoreError):
        split_url(url)


def test_a_file_store_is_listed_and_fetched(tmp_path: Path) -> None:
    run_dir = tmp_path / "ns/job/u-1"
    run_dir.mkdir(parents=True)
    files = {"a.txt": b"hello", "bin": bytes(range(256))}
    (run_dir / "00-work-out.tar.zst").write_bytes(tar_of([(k, v, None) for k, v in files.items()], "zstd"))
    (run_dir / "00-work-out.manifest.json").write_bytes(manifest_json(files, "ns/job/u-1/00-work-out.tar.zst", "zstd"))
    status = RunStatus.from_dict(
        {
            "phase": "Stopped",
            "readBack": [
                {
                    "path": "/work/out",
                    "phase": "Drained",
                    "object": f"file://{run_dir}/00-work-out.tar.zst",
                    "manifest": f"file://{run_dir}/00-work-out.manifest.json",
                }
            ],
        }
    )
    run_files = RunFiles("job", status, StoreReader())
    listed = run_files.files()
    assert [(f.container_path, f.size) for f in listed] == [("/work/out/a.txt", 5), ("/work/out/bin", 256)]
    assert [run_files.fetch(f) for f in listed] == [b"hello", bytes(range(256))]
    (out,) = run_files.download(tmp_path / "dl")
    assert out.name == "00-work-out" and (out / "bin").read_bytes() == bytes(range(256))


def test_stdin_is_counted_in_the_pod_instead_of_closed() -> None:
    from sandboxrun.exec import with_counted_stdin

    assert with_counted_stdin(["sh", "-c", 'cat > "$1"', "sh", "/out/x"], 5) == [
        "sh",
        "-c",
        'head -c "$0" | "$@"',
        "5",
        "sh",
        "-c",
        'cat > "$1"',
        "sh",
        "/out/x",
    ]
