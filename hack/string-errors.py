#!/usr/bin/env python3
"""A ratchet on `Result<_, String>` in runtime code (issue #43: error types a reader can follow).

Counts, per file under src/, the lines that name a `Result<…, String>` outside test code (each item
under `#[cfg(test)]`, to its matching brace). hack/string-errors.allow lists the files that may
still have some and how many; a file over its allowance, or one not listed that has any, fails:
new code returns a typed error (thiserror). Lower a file's allowance when you convert one (the
check says when a file is below it, so the list only shrinks).

    hack/string-errors.py [src]          exit 0 ok, 1 over an allowance
"""
import pathlib
import re
import sys

from rust_source import allowances, without_tests

RESULT_STRING = re.compile(r"Result<[^;{}]*,\s*String>")
# A map of strings inside the Ok type is not an error type: `Map<String, String>` is read as one.
STRING_MAP = re.compile(r"Map<String,\s*String>")
ALLOW = pathlib.Path(__file__).with_name("string-errors.allow")


def runtime_lines(path: pathlib.Path) -> list[str]:
    # every item under `#[cfg(test)]` blanked to its matching brace, so the code after an inline
    # test module is counted too (hack/rust_source.py)
    return without_tests(path.read_text()).splitlines()


def counts(root: pathlib.Path) -> dict[str, int]:
    found = {}
    for path in sorted(root.rglob("*.rs")):
        n = sum(
            1 for line in runtime_lines(path) if RESULT_STRING.search(STRING_MAP.sub("Map<_>", line))
        )
        if n:
            found[path.as_posix()] = n
    return found


def self_test() -> int:
    """The count sees runtime code, also after the tests module, and skips each item under cfg(test)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = pathlib.Path(d) / "a.rs"
        f.write_text(
            "fn f() -> Result<(), String> { Ok(()) }\n"
            "fn g() -> Result<Vec<u8>, std::io::Error> { todo!() }\n"
            "fn k() -> Result<BTreeMap<String, String>, Error> { todo!() }\n"
            "#[cfg(test)]\nmod tests {\n    fn h() -> Result<(), String> { Ok(()) }\n"
            "    fn brace_in_a_string() -> &'static str { \"}\" }\n}\n"
            "fn after_the_tests() -> Result<(), String> { Ok(()) }\n"
            "#[cfg(test)]\nfn a_test_helper() -> Result<(), String> { Ok(()) }\n"
        )
        got = counts(pathlib.Path(d))
    if got != {f.as_posix(): 2}:
        print(f"string-errors: self-test failed: {got}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src")
    found, allowed = counts(root), allowances(ALLOW)
    bad = [
        f"{path}: {n} Result<_, String> (allowed {allowed.get(path, 0)})"
        for path, n in found.items()
        if n > allowed.get(path, 0)
    ]
    below = [
        f"{path}: {found.get(path, 0)} now, allowed {n}: lower it in {ALLOW.name}"
        for path, n in allowed.items()
        if found.get(path, 0) < n
    ]
    for line in below:
        print(f"string-errors: {line}", file=sys.stderr)
    if bad:
        print("string-errors: runtime code returns Result<_, String> (use a typed error):", file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"string-errors: {sum(found.values())} left in {len(found)} files, none new", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
