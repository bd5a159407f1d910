#!/usr/bin/env python3
"""Only act writes (issue #57 item 5, docs/architecture.md "The reconcile pipeline"): the calls that
change the world — the apiserver's write verbs on a kube `Api` (create, patch, replace, delete and
their `_status` / `_subresource` forms, evict), an Event published through the Recorder, exec and attach into a pod, and the object store's
puts and deletes — stand in the act stages only. `make check` runs it.

The act stages are `src/controller/run/act.rs`, `drive.rs` and the pools' `pools/act.rs` (free of the count); every
other file that makes such calls is listed in hack/io-outside-act.allow with how many and why (the
documented loops' act stages, the drain engine act runs, the webhook's and the CLI's own I/O). A
file over its allowance, or one not listed that has any, fails: new I/O goes through act. Lower a
file's allowance when you move a call into act (the check says when a file is below it, so the
list only shrinks).

A call is a method call `.verb(…)` in runtime code (comments and literals blanked, items under
`#[cfg(test)]` and test-only files skipped, hack/rust_source.py). The verbs kube shares with std
are told apart by their arguments: `replace`/`patch` take three (`name, &params, &obj`) where
`str::replace` takes two, `create` takes two (`&params, &obj`), `publish` two (`&event, &reference`), `exec` at least two (a
`CommandExt::exec()` in the pod takes none); `delete` counts with any (the store's takes one).

    hack/io-outside-act.py [src]      exit 0 ok, 1 over an allowance
    hack/io-outside-act.py --self-test
"""
import pathlib
import re
import sys

from rust_source import allowances, blank, is_test_file, matching_paren, rust_files, test_files, test_spans

ACT = {
    "src/controller/run/act.rs",
    "src/controller/run/drive.rs",
    # the pools' controller's act stage (docs/architecture.md "The controllers beside the pipeline")
    "src/controller/pools/act.rs",
}
ALLOW = pathlib.Path(__file__).with_name("io-outside-act.allow")
CALL = re.compile(
    r"\.\s*(create|patch|replace|delete|patch_status|replace_status|create_subresource"
    r"|patch_subresource|replace_subresource|delete_collection|patch_metadata|evict|exec|attach"
    r"|put|put_opts|put_multipart|put_multipart_opts|copy|copy_if_not_exists|rename"
    r"|rename_if_not_exists|delete_stream|publish)\s*(?:::\s*<[^>]*>\s*)?\("
)
# The fewest arguments a call of the verb takes to be the kube / store one (default: any).
MIN_ARGS = {"create": 2, "patch": 3, "replace": 3, "patch_status": 3, "replace_status": 3, "exec": 2,
            "publish": 2}


def args_of(text: str, open_at: int) -> int:
    """How many top-level arguments the call whose `(` is at `open_at` passes."""
    close = matching_paren(text, open_at)
    inner = text[open_at + 1 : close if close >= 0 else len(text)]
    if not inner.strip():
        return 0
    depth, n = 0, 1
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            n += 1
    return n - 1 if inner.rstrip().endswith(",") else n


def calls(src: str) -> list[tuple[int, str]]:
    """(line, verb) of each write call in the runtime code of `src`."""
    text = blank(src)
    skip = test_spans(text)
    found = []
    for m in CALL.finditer(text):
        if any(a <= m.start() <= b for a, b in skip):
            continue
        verb = m.group(1)
        if args_of(text, m.end() - 1) < MIN_ARGS.get(verb, 0):
            continue
        found.append((text.count("\n", 0, m.start()) + 1, verb))
    return found


def counts(root: pathlib.Path) -> dict[str, list[tuple[int, str]]]:
    tests = test_files([str(root)])
    found = {}
    for path in sorted(rust_files([str(root)])):
        rel = pathlib.Path(path).as_posix()
        if is_test_file(path, tests) or rel in ACT or rel.endswith("/main.rs"):
            continue
        hits = calls(pathlib.Path(path).read_text())
        if hits:
            found[rel] = hits
    return found


def self_test() -> int:
    src = (
        "fn w(api: Api<Pod>) { api.create(&pp, &pod); api.patch(n, &pp, &Patch::Merge(&p)); }\n"
        "fn s(x: &str) -> String { x.replace(\"a\", \"b\") + &x.replace('c', \"d\") }\n"
        "fn e(c: Command) { c.exec(); }\n"
        "// api.delete(n, &dp) in a comment\n"
        "fn k(api: Api<Pod>) { let s = \"api.delete(n, &dp)\"; api.delete(n, &dp); store.put(&k, b); }\n"
        "#[cfg(test)]\nmod tests {\n    fn t(api: Api<Pod>) { api.delete(n, &dp); }\n}\n"
        "fn after(api: Api<Pod>) { api\n    .exec(pod, argv, &ap); }\n"
    )
    got = calls(src)
    want = [(1, "create"), (1, "patch"), (5, "delete"), (5, "put"), (11, "exec")]
    if got != want:
        print(f"io-outside-act: self-test failed: {got} != {want}", file=sys.stderr)
        return 1
    print("io-outside-act: self-test ok", file=sys.stderr)
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src")
    found, allowed = counts(root), allowances(ALLOW)
    bad = [
        f"{path}: {len(hits)} write call(s) (allowed {allowed.get(path, 0)}): "
        + ", ".join(f"{verb} at line {line}" for line, verb in hits)
        for path, hits in found.items()
        if len(hits) > allowed.get(path, 0)
    ]
    for path, n in allowed.items():
        if len(found.get(path, [])) < n:
            print(f"io-outside-act: {path}: {len(found.get(path, []))} now, allowed {n}: "
                  f"lower it in {ALLOW.name}", file=sys.stderr)
    if bad:
        print("io-outside-act: writes outside act (plan an effect and let act carry it out):",
              file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
        return 1
    total = sum(len(h) for h in found.values())
    print(f"io-outside-act: {total} write call(s) outside act in {len(found)} allowed files, none new",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
