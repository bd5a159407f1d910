#!/usr/bin/env python3
"""The function-length gate of `make check` (issue #43): no Rust function longer than MAX lines
as a reader counts them — every line from the one where `fn` stands (the signature, however many
lines it takes) to the line of the body's closing brace, comments and blank lines included.
Test code is excluded: an item under `#[cfg(test)]` (a `mod tests { … }` or a single test
helper), and a whole file declared as `#[cfg(test)] mod name;`.

    python3 hack/fn-length.py [--max N] DIR_OR_FILE...   exit 1 and list each function over N
    python3 hack/fn-length.py --self-test                checks the scanner on small sources

The scanner blanks comments (line and nested block), string literals (plain, byte, raw with any
number of #), and char literals (told apart from lifetimes) before matching braces, keeping
newlines so that line numbers stay right (the scanner is hack/rust_source.py, shared with the
other checks).
"""
import os
import re
import sys

from rust_source import blank, is_test_file, matching, rust_files, test_files, test_spans

MAX = 80
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def functions(src):
    """(name, first line, lines) of every function with a body, outside test code."""
    text = blank(src)
    skip = test_spans(text)
    found = []
    for m in FN.finditer(text):
        if any(a <= m.start() <= b for a, b in skip):
            continue
        # The body opens at the first `{` after the signature, unless a `;` ends it first (a
        # trait method without a body). Parentheses/brackets/angle brackets in the signature
        # hold no braces once literals are blanked, except `{` in const-generic blocks, rare
        # enough to ignore.
        j, depth = m.end(), 0
        while j < len(text):
            ch = text[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch == ";" and depth == 0:
                j = -1
                break
            elif ch == "{" and depth == 0:
                break
            j += 1
        if j < 0 or j >= len(text):
            continue
        end = matching(text, j)
        if end < 0:
            continue
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, end) + 1
        found.append((m.group(1), first, last - first + 1))
    return found


def check(paths, limit):
    over = []
    tests = test_files(paths)
    for path in sorted(rust_files(paths)):
        if is_test_file(path, tests):
            continue
        with open(path, encoding="utf-8") as f:
            src = f.read()
        for name, line, lines in functions(src):
            if lines > limit:
                over.append((path, line, name, lines))
    for path, line, name, lines in over:
        print(f"{path}:{line}: fn {name} is {lines} lines (at most {limit})")
    print(f"fn-length: {len(over)} function(s) over {limit} lines")
    return 1 if over else 0


def self_test():
    src = '''
fn short() {
    let s = "}}}{{{";   // a } in a comment
    let c = '}';
    let r = r#"{ "quoted" }"#;
    /* { nested /* } */ } */
    let l: &'static str = "x";
    let b = b'{';
}

trait T { fn no_body(&self); }

fn body_on_next_line()
    -> u8
{
    1
}

#[cfg(test)]
mod tests {
    fn in_tests_is_skipped() {
        let x = 1;
    }
}

fn generic<'a, T: Fn(&'a str) -> u8>(f: T) -> u8 { f("{") }
'''
    got = {name: lines for name, _, lines in functions(src)}
    want = {"short": 8, "body_on_next_line": 5, "generic": 1}
    assert got == want, f"{got} != {want}"
    long_fn = "fn long() {\n" + "\n" * 79 + "}\n"
    assert functions(long_fn) == [("long", 1, 81)], functions(long_fn)
    signature = "pub(crate) fn sig(\n    a: u8,\n) -> u8 {\n    a\n}\n"
    assert functions(signature) == [("sig", 1, 5)], functions(signature)
    assert blank('"a\\"}"') == " " * 6
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "c"))
        with open(os.path.join(d, "c.rs"), "w", encoding="utf-8") as f:
            f.write("#[cfg(test)]\nmod fixtures;\nmod real;\n")
        for name in ("fixtures", "real"):
            with open(os.path.join(d, "c", name + ".rs"), "w", encoding="utf-8") as f:
                f.write("fn f() {\n" + "\n" * 90 + "}\n")
        tests = test_files([d])
        assert is_test_file(os.path.join(d, "c", "fixtures.rs"), tests), tests
        assert not is_test_file(os.path.join(d, "c", "real.rs"), tests), tests
    print("fn-length: self-test ok")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    args, limit = argv[1:], MAX
    if len(args) >= 2 and args[0] == "--max":
        limit, args = int(args[1]), args[2:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    return check(args, limit)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
