#!/usr/bin/env python3
"""Renders the krew manifest template (deploy/krew/sandboxrun.yaml, krew-release-bot syntax) for
one release: the tag, and the linux/amd64 platform's uri and sha256 (hack/release.sh). The
template's other platforms are left out: only linux/amd64 is built (docs/operations.md
"Releases").

    release_krew.py TEMPLATE TAG URI SHA256 > sandboxrun.yaml
"""
import re
import sys


def render(template: str, tag: str, uri: str, sha256: str) -> str:
    head, sep, platforms = template.partition("  platforms:\n")
    if not sep:
        raise SystemExit("the template has no platforms")
    blocks = re.split(r"(?m)^(?=    - selector:)", platforms)
    amd64 = [b for b in blocks if "arch: amd64" in b and "os: linux" in b]
    if len(amd64) != 1:
        raise SystemExit("the template has no single linux/amd64 platform")
    block = re.sub(
        r"(?m)^(\s*)\{\{\s*addURIAndSha .*\}\}\s*$",
        lambda m: f"{m.group(1)}uri: {uri}\n{m.group(1)}sha256: {sha256}",
        amd64[0],
    )
    # The template's own header comments describe the template, not the release.
    lines = head.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    out = "".join(lines).replace("{{ .TagName }}", tag) + sep + block
    if "{{" in out:
        raise SystemExit("a template expression is left unrendered")
    return out


def main() -> None:
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    path, tag, uri, sha256 = sys.argv[1:]
    with open(path, encoding="utf-8") as f:
        sys.stdout.write(render(f.read(), tag, uri, sha256))


if __name__ == "__main__":
    main()
