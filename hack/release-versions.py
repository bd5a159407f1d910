#!/usr/bin/env python3
"""The versions a release names agree (issue #56 item 3; docs/operations.md "Releases"):

  - Cargo.toml's version (what the binary reports, `sandboxrun-operator --version`, and what the
    operator publishes in its settings), Cargo.lock's entry for it, the chart's `version` and
    `appVersion`, the Python client's (clients/python/pyproject.toml: its wheel, which
    hack/release.sh builds) and the newest section of CHANGELOG.md are one version;
  - the image the chart deploys by default is that version: values.yaml's `image.tag` is empty
    (the templates default it to `.Chart.AppVersion`) or that version, and `holderImage` is empty
    (the operator's image) or tagged with it;
  - the krew manifest names no other version: its `version` and download URLs are the release
    tag (`{{ .TagName }}`, which hack/release_krew.py fills with v<version>) or v<version>;
  - every version charts/RELEASED records has a CHANGELOG section not marked "(unreleased)", the
    newest of them is the CHANGELOG's latest released section, and every section but the oldest
    has an "### Upgrading" part.

  hack/release-versions.py [REPO]                       check the tree (make check)
  hack/release-versions.py --version X.Y.Z [REPO]       and that X.Y.Z is that version
                                                        (hack/release.sh, before it builds)
  hack/release-versions.py --self-test                  each rule fails on a seeded drift

Exit 1 with one line per disagreement."""
import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

CHART = Path("charts/sandboxrun-operator")
TAG = "{{ .TagName }}"
PYTHON_CLIENT = Path("clients/python/pyproject.toml")


def chart_field(text, key):
    m = re.search(rf'(?m)^{key}:\s*"?([^"\s]+)"?\s*$', text)
    return m.group(1) if m else None


def image_block_field(values, key):
    """A key of values.yaml's top-level `image:` block (two-space indent), unquoted."""
    _, sep, rest = values.partition("\nimage:\n")
    if not sep:
        return None
    block = re.match(r"(?:(?:  .*|\s*)\n)*", rest).group(0)
    m = re.search(rf'(?m)^  {key}:\s*(.*?)\s*(?:#.*)?$', block)
    return m.group(1).strip("\"'") if m else None


def changelog_sections(text):
    """[(version, unreleased, body)] newest first."""
    heads = list(re.finditer(r"(?m)^## (\S+)(\s+\(unreleased\))?\s*$", text))
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        out.append((m.group(1), bool(m.group(2)), text[m.end():end]))
    return out


def semver_key(v):
    core = v.split("-", 1)[0]
    return tuple(int(p) for p in core.split(".")) + ((1,) if "-" not in v else (0, v))


def version_sources(repo):
    """The version each source names (None when it names none)."""
    cargo = tomllib.loads((repo / "Cargo.toml").read_text())
    name, version = cargo["package"]["name"], cargo["package"]["version"]
    lock = tomllib.loads((repo / "Cargo.lock").read_text())
    locked = [p["version"] for p in lock.get("package", []) if p.get("name") == name]
    chart = (repo / CHART / "Chart.yaml").read_text()
    sections = changelog_sections((repo / "CHANGELOG.md").read_text())
    python = tomllib.loads((repo / PYTHON_CLIENT).read_text()).get("project", {})
    return {
        "Cargo.toml version": version,
        "Cargo.lock's sandboxrun-operator": locked[0] if locked else None,
        "Chart.yaml version": chart_field(chart, "version"),
        "Chart.yaml appVersion": chart_field(chart, "appVersion"),
        "clients/python/pyproject.toml version": python.get("version"),
        "CHANGELOG.md's newest section": sections[0][0] if sections else None,
    }


def check_sources(repo, wanted):
    sources = version_sources(repo)
    version = wanted or sources["Cargo.toml version"]
    return [
        f"{what} is {found}, not {version}"
        for what, found in sources.items()
        if found != version
    ], version


def check_image(repo, version):
    errors = []
    values = (repo / CHART / "values.yaml").read_text()
    tag = image_block_field(values, "tag")
    if tag is None:
        errors.append("values.yaml has no image.tag")
    elif tag not in ("", version):
        errors.append(f"values.yaml's image.tag is {tag}, not empty (the appVersion) or {version}")
    helpers = (repo / CHART / "templates" / "_helpers.tpl").read_text()
    if "(default .Chart.AppVersion .Values.image.tag)" not in helpers:
        errors.append("templates/_helpers.tpl no longer defaults the image tag to .Chart.AppVersion")
    holder = re.search(r'(?m)^holderImage:\s*"?([^"\s#]*)"?', values)
    if holder and holder.group(1) and not holder.group(1).endswith(f":{version}"):
        errors.append(f"values.yaml's holderImage {holder.group(1)} is not the operator's {version}")
    return errors


def check_krew(repo, version):
    text = (repo / "deploy" / "krew" / "sandboxrun.yaml").read_text()
    ok = (TAG, f"v{version}")
    errors = []
    m = re.search(r"(?m)^  version:\s*(.*?)\s*$", text)
    if not m or m.group(1) not in ok:
        errors.append(f"the krew manifest's version is {m.group(1) if m else 'missing'}, not {TAG} or v{version}")
    for found in re.findall(r"/releases/download/([^/\s\"]+)/", text):
        if found not in ok:
            errors.append(f"the krew manifest downloads from release {found}, not {TAG} or v{version}")
    return errors


def check_changelog(repo):
    sections = changelog_sections((repo / "CHANGELOG.md").read_text())
    errors = []
    for version, _, body in sections[:-1]:
        if not re.search(r"(?m)^### Upgrading", body):
            errors.append(f"CHANGELOG.md's {version} has no '### Upgrading' part")
    released_file = repo / "charts" / "RELEASED"
    recorded = []
    if released_file.exists():
        recorded = [
            line.split()[0]
            for line in released_file.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
    by_version = {v: unreleased for v, unreleased, _ in sections}
    for v in recorded:
        if v not in by_version:
            errors.append(f"charts/RELEASED records {v}, which CHANGELOG.md has no section for")
        elif by_version[v]:
            errors.append(f"charts/RELEASED records {v}, whose CHANGELOG.md section says unreleased")
    latest = next((v for v, unreleased, _ in sections if not unreleased), None)
    if recorded and latest != max(recorded, key=semver_key):
        errors.append(
            f"CHANGELOG.md's latest released section is {latest}, "
            f"charts/RELEASED's newest is {max(recorded, key=semver_key)}"
        )
    return errors


def check(repo, wanted=None):
    errors, version = check_sources(repo, wanted)
    return errors + check_image(repo, version) + check_krew(repo, version) + check_changelog(repo)


def self_test():
    """Every rule on a copy of this tree: clean, then each seeded drift found."""
    repo = Path(__file__).resolve().parent.parent
    files = ["Cargo.toml", "Cargo.lock", "CHANGELOG.md", "charts/RELEASED", str(PYTHON_CLIENT),
             "deploy/krew/sandboxrun.yaml", *(str(CHART / f) for f in
             ("Chart.yaml", "values.yaml", "templates/_helpers.tpl"))]
    drifts = [  # (file, old, new, what the error names)
        ("Cargo.toml", r'(?m)^version = ".*"', 'version = "9.9.9"', "Chart.yaml version is"),
        (str(CHART / "Chart.yaml"), r"(?m)^appVersion: .*", 'appVersion: "9.9.9"', "appVersion is 9.9.9"),
        (str(PYTHON_CLIENT), r'(?m)^version = "[^"]*"', 'version = "9.9.9"', "pyproject.toml version is 9.9.9"),
        ("CHANGELOG.md", r"(?m)^## (\S+)", r"## 9.9.9\n\n### Upgrading\n\n## \1", "newest section is 9.9.9"),
        (str(CHART / "values.yaml"), r'(?m)^  tag: ""', '  tag: "0.0.1"', "image.tag is 0.0.1"),
        (str(CHART / "values.yaml"), r'(?m)^holderImage: ""', 'holderImage: "x/op:0.0.1"', "holderImage"),
        ("deploy/krew/sandboxrun.yaml", r"download/\{\{ \.TagName \}\}/", "download/v0.0.1/", "release v0.0.1"),
        ("charts/RELEASED", r"\Z", "\n9.0.0 tree commit\n", "records 9.0.0"),
        ("CHANGELOG.md", r"(?m)^### Upgrading from 0\.1\.0", "### Notes", "0.2.0 has no '### Upgrading'"),
    ]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        for f in files:
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo / f, copy / f)
        clean = check(copy)
        if clean:
            failures.append(f"the tree itself: {clean}")
        wrong = check(copy, "9.9.9")
        if not any("Cargo.toml version is" in e for e in wrong):
            failures.append(f"--version 9.9.9 passed: {wrong}")
        for f, old, new, expect in drifts:
            original = (copy / f).read_text()
            seeded, n = re.subn(old, new, original, count=1)
            if n != 1:
                failures.append(f"the drift {old!r} found nothing in {f}")
                continue
            (copy / f).write_text(seeded)
            errors = check(copy)
            if not any(expect in e for e in errors):
                failures.append(f"{f}: {old!r} -> {new!r} not found ({errors})")
            (copy / f).write_text(original)
    if failures:
        sys.exit("release-versions.py --self-test failed:\n" + "\n".join(failures))
    print(f"release-versions: self-test ok ({len(drifts) + 1} seeded drifts found)")


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    wanted = None
    if argv[:1] == ["--version"]:
        if len(argv) < 2:
            sys.exit(__doc__)
        wanted, argv = argv[1], argv[2:]
    repo = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    errors = check(repo, wanted)
    if errors:
        for e in errors:
            print(f"release-versions: {e}", file=sys.stderr)
        sys.exit(1)
    sources = version_sources(repo)
    print(f"release-versions: {sources['Cargo.toml version']} everywhere")


if __name__ == "__main__":
    main(sys.argv[1:])
