#!/usr/bin/env python3
"""The Python client's wheel (clients/python, package `sandboxrun`), reproducibly and with no
build tool but Python itself (issue #56 item 3; hack/release.sh puts it in dist/<version>/):

  hack/python-wheel.py CLIENT_DIR OUT_DIR    write OUT_DIR/<name>-<version>-py3-none-any.whl, print its path
  hack/python-wheel.py --self-test           two builds are the same bytes; the wheel is well formed

A pure-Python wheel is a zip (PEP 427): the package's files from src/ (no __pycache__), and
<name>-<version>.dist-info/ with METADATA (from pyproject.toml's [project]: name, version,
summary, Python and package requirements, the README), WHEEL and RECORD (each file's sha256).
Entries are sorted, dated 1980-01-01, mode 0644: the same tree gives the same bytes, which
SHA256SUMS can name."""
import base64
import hashlib
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

EPOCH = (1980, 1, 1, 0, 0, 0)


def metadata(project, readme):
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
    ]
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in sorted(project.get("optional-dependencies", {}).items()):
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme


def entry_points(project):
    """entry_points.txt of the console scripts ([project.scripts]), or None without any."""
    scripts = project.get("scripts", {})
    if not scripts:
        return None
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(scripts.items()))


def package_files(client):
    """(archive name, bytes) of every file under src/ but caches, sorted."""
    src = client / "src"
    files = [
        p for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    ]
    return sorted((p.relative_to(src).as_posix(), p.read_bytes()) for p in files)


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build(client, out):
    project = tomllib.loads((client / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    readme = (client / project.get("readme", "README.md")).read_text()
    info = f"{name}-{version}.dist-info"
    entries = package_files(client) + [
        (f"{info}/METADATA", metadata(project, readme).encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: hack/python-wheel.py\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    scripts = entry_points(project)
    if scripts is not None:
        entries.append((f"{info}/entry_points.txt", scripts.encode()))
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for entry_name, data in entries:
            entry = zipfile.ZipInfo(entry_name, EPOCH)
            entry.external_attr = 0o100644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    return wheel


def self_test():
    client = Path(__file__).resolve().parent.parent / "clients" / "python"
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        a, b = build(client, Path(tmp) / "a"), build(client, Path(tmp) / "b")
        if a.read_bytes() != b.read_bytes():
            failures.append("two builds of the same tree differ")
        with zipfile.ZipFile(a) as z:
            names = z.namelist()
            version = tomllib.loads((client / "pyproject.toml").read_text())["project"]["version"]
            info = f"sandboxrun-{version}.dist-info"
            for wanted in ("sandboxrun/__init__.py", "sandboxrun/py.typed", f"{info}/METADATA",
                           f"{info}/WHEEL", f"{info}/RECORD"):
                if wanted not in names:
                    failures.append(f"the wheel lacks {wanted}")
            if f"{info}/entry_points.txt" not in names or b"sandboxrun-mcp = sandboxrun.mcp_server:main" not in z.read(
                f"{info}/entry_points.txt"
            ):
                failures.append("the wheel lacks the sandboxrun-mcp console script (entry_points.txt)")
            if any("__pycache__" in n for n in names):
                failures.append("the wheel carries __pycache__")
            meta = z.read(f"{info}/METADATA").decode()
            if f"Version: {version}\n" not in meta or "Requires-Dist: kubernetes" not in meta:
                failures.append(f"METADATA lacks the version or the requirements:\n{meta[:400]}")
            for line in z.read(f"{info}/RECORD").decode().splitlines():
                entry, digest, _ = line.split(",")
                if digest and digest != record_hash(z.read(entry)):
                    failures.append(f"RECORD's hash of {entry} is wrong")
    if failures:
        sys.exit("python-wheel.py --self-test failed:\n" + "\n".join(failures))
    print("python-wheel: self-test ok (reproducible, well formed)")


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        sys.exit(__doc__)
    print(build(Path(argv[0]), Path(argv[1])))


if __name__ == "__main__":
    main(sys.argv[1:])
