#!/usr/bin/env python3
"""Module-level import cycles in src/ (issues #12, #26), checked by hack/test.sh.

An edge a -> b for every path from module a that names module b outside `#[cfg(test)]` modules:
`crate::b::..`, `super::..` (a's parent, or an item in it), `self::child::..` and a bare
`child::..` of a's own child modules. Parent <-> child edges are kept: a child that calls back
into its parent while the parent calls it is a cycle like any other.
src/main.rs is a separate crate (it names the library as `sandboxrun_operator::`) and is skipped.

Usage: hack/import-cycles.py [src]
Exit status: 0 when there is no cycle, 1 when there is one (each printed with its edges)."""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else "src"
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs"):
            continue
        p = os.path.relpath(os.path.join(d, f), root)[:-3]
        if p == "main":
            continue
        parts = p.split("/")
        if parts[-1] in ("mod", "lib"):
            parts = parts[:-1]
        files["::".join(parts)] = os.path.join(d, f)
mods = set(files)


def strip_tests(text):
    # drop everything from the first `#[cfg(test)]` mod to the end (the convention in this repo)
    m = re.search(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text


def resolve(path):
    parts = [p for p in path.split("::") if p]
    for n in range(len(parts), 0, -1):
        cand = "::".join(parts[:n])
        if cand in mods:
            return cand
    return None


def parent(m):
    return "::".join(m.split("::")[:-1])


def children(m):
    prefix = m + "::" if m else ""
    return {c[len(prefix):] for c in mods if c.startswith(prefix) and c != m and "::" not in c[len(prefix):]}


def expand_groups(text):
    """`crate::a::{b, c::d}` -> `crate::a::b`, `crate::a::c::d` (one level of braces)."""
    out = []
    for head, inner in re.findall(r"\b((?:crate|super|self)(?:::\w+)*)::\{([^{}]*)\}", text):
        for it in inner.split(","):
            it = it.strip().split(" as ")[0].strip()
            if it and it != "self":
                out.append(head + "::" + it)
            elif it == "self":
                out.append(head)
    return out


edges = {m: set() for m in mods}
for m, f in files.items():
    text = strip_tests(open(f).read())
    text = re.sub(r"//[^\n]*", "", text)
    paths = re.findall(r"\b(?:crate|super|self)(?:::\w+)+", text) + expand_groups(text)
    kids = children(m)
    # a bare `child::` (not the tail of a longer path such as `crate::x::child::`)
    for k in kids:
        if re.search(r"(?<![\w:])" + re.escape(k) + r"::", text):
            edges[m].add((m + "::" + k) if m else k)
    for p in paths:
        head, _, rest = p.partition("::")
        if head == "crate":
            target = resolve(rest)
        elif head == "super":
            # `super::super::x`: one level up per `super`.
            base = parent(m)
            while rest == "super" or rest.startswith("super::"):
                base = parent(base)
                rest = rest[len("super::"):] if rest.startswith("super::") else ""
            target = resolve((base + "::" + rest) if base else rest) if rest else None
            if target is None:
                target = base if base in mods else None
        else:  # self
            target = resolve((m + "::" + rest) if m else rest)
        if target is not None and target != m and target != "":
            edges[m].add(target)
# the crate root only declares modules
edges.pop("", None)
mods.discard("")
for m in edges:
    edges[m].discard("")

# Tarjan SCC
idx, low, st, on, out, c = {}, {}, [], set(), [], [0]


def sc(v):
    idx[v] = low[v] = c[0]
    c[0] += 1
    st.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in idx:
            sc(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        out.append(comp)


sys.setrecursionlimit(10000)
for v in sorted(mods):
    if v not in idx:
        sc(v)
cyc = [sorted(x) for x in out if len(x) > 1]
print(f"modules: {len(mods)}, edges: {sum(len(e) for e in edges.values())}")
if not cyc:
    print("import cycles: none")
    sys.exit(0)
for comp in cyc:
    s = set(comp)
    print("cycle:", " <-> ".join(comp))
    for a in comp:
        for b in sorted(edges[a] & s):
            print(f"   {a} -> {b}")
sys.exit(1)
