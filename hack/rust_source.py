"""The Rust source scanner the static checks share (hack/fn-length.py, hack/import-cycles.py,
hack/string-errors.py, hack/io-outside-act.py): comments and literals blanked, braces matched, so
that test code is skipped item by item (issue #57 item 5: a check that stopped at the first
`#[cfg(test)] mod` never read what a file has after it).

`blank` replaces every comment (line and nested block), string literal (plain, byte, raw with any
number of #) and char literal (told apart from lifetimes) with spaces, keeping newlines and the
length, so an index or a line number in the blanked text is the same in the source.
`test_spans` are the items under `#[cfg(test)]` (a `mod tests { … }` to its matching brace, or an
item without a body to its `;`); `without_tests` is the source with those spans blanked; `test_files` the files of modules
declared `#[cfg(test)] mod name;` (test code as a whole).
"""
import os
import re


def blank(src):
    """`src` with every comment, string and char literal replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(src)

    def keep(s):
        out.append("".join(c if c == "\n" else " " for c in s))

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            keep(src[i:j])
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            keep(src[i:j])
            i = j
        elif c in "rb" and re.match(r"(?:br|r)#*\"", src[i:i + 300]) and not _ident_before(src, i):
            m = re.match(r"(?:br|r)(#*)\"", src[i:])
            close = '"' + m.group(1)
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            keep(src[i:j])
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i) and not _ident_before(src, i)):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            keep(src[i:j + 1])
            i = j + 1
        elif c == "'" or (c == "b" and src.startswith("b'", i) and not _ident_before(src, i)):
            start = i + (2 if c == "b" else 1)
            m = re.match(r"(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]*\}|.)|[^\\\n])'", src[start:])
            if m:  # a char literal; otherwise a lifetime or label: left as it is
                keep(src[i:start + m.end()])
                i = start + m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_before(src, i):
    return i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_")


def matching(text, open_at):
    """The index of the brace closing the one at `open_at`, or -1."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def matching_paren(text, open_at):
    """The index of the parenthesis closing the one at `open_at`, or -1 (literals blanked first)."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j
    return -1


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")


def test_spans(text):
    """(start, end) character spans of the items under #[cfg(test)]."""
    spans = []
    for m in CFG_TEST.finditer(text):
        j = m.end()
        # The item ends at its closing brace, or at `;` for an item without a body.
        while j < len(text) and text[j] not in "{;":
            j += 1
        if j < len(text) and text[j] == "{":
            end = matching(text, j)
            spans.append((m.start(), len(text) if end < 0 else end))
        else:
            spans.append((m.start(), j))
    return spans


def without_tests(src):
    """`src` with every item under `#[cfg(test)]` replaced by spaces (newlines kept): the runtime code."""
    spans = test_spans(blank(src))
    if not spans:
        return src
    out, at = [], 0
    for a, b in sorted(spans):
        if b < at:
            continue
        a = max(a, at)
        out.append(src[at:a])
        out.append("".join(c if c == "\n" else " " for c in src[a:b + 1]))
        at = b + 1
    out.append(src[at:])
    return "".join(out)


def rust_files(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, _, names in os.walk(p):
            for name in sorted(names):
                if name.endswith(".rs"):
                    yield os.path.join(root, name)


CFG_TEST_MOD = re.compile(
    r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;"
)


def test_files(paths):
    """The files of modules declared `#[cfg(test)] mod name;` (and their submodules' files)."""
    out = set()
    for path in rust_files(paths):
        with open(path, encoding="utf-8") as f:
            text = blank(f.read())
        here, base = os.path.split(path)
        stem = base[:-3]
        parent = here if stem in ("mod", "lib", "main") else os.path.join(here, stem)
        for m in CFG_TEST_MOD.finditer(text):
            out.add(os.path.normpath(os.path.join(parent, m.group(1) + ".rs")))
            out.add(os.path.normpath(os.path.join(parent, m.group(1))))
    return out


def is_test_file(path, tests):
    path = os.path.normpath(path)
    return path in tests or any(path.startswith(t + os.sep) for t in tests)


def allowances(path):
    """A ratchet's allowance file: `<path> <count>` per line, `#` starts a comment."""
    allowed = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            file, n = line.split()
            allowed[file] = int(n)
    return allowed
