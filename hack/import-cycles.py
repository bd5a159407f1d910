#!/usr/bin/env python3
"""Import cycles in src/ at two levels (issues #12, #26, #43), checked by `make check`.

Modules: an edge a -> b for every path from module a that names module b outside test code:
`crate::b::..`, `super::..` (a's parent, or an item in it), `self::child::..` and a bare
`child::..` of a's own child modules. Parent <-> child edges are kept: a child that calls back
into its parent while the parent calls it is a cycle like any other. Test code is left out: every
item under `#[cfg(test)]` (a `mod tests { .. }` to its matching brace, wherever it stands), and a whole file its parent declares
`#[cfg(test)] mod name;`.
Areas: the same edges collapsed to the top-level modules (`controller::run::plan::create` is in the
area `controller`); an area cycle is two areas that need each other through any of their files.
src/main.rs is a separate crate (it names the library as `sandboxrun_operator::`) and is skipped.

Usage: hack/import-cycles.py [src]                  both levels; exit 1 on a cycle at either
       hack/import-cycles.py --self-test            the scanner on a small tree
       hack/import-cycles.py --areas-mermaid [src]  the area graph as a Mermaid flowchart
       hack/import-cycles.py --check-doc DOC [src]  exit 1 unless DOC holds that flowchart between
                                                    the markers <!-- areas:begin --> / <!-- areas:end -->
Each cycle is printed with its edges (for areas: the module edges behind each arrow)."""
import os, re, sys

from rust_source import without_tests

args = sys.argv[1:]
mode = "check"
if args == ["--self-test"]:
    # the code after an inline test module is read (issue #57 item 5), the module's body is not
    import subprocess, tempfile
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "lib.rs"), "w").write("mod a;\nmod b;\nmod c;\n")
        open(os.path.join(d, "a.rs"), "w").write(
            "#[cfg(test)]\nmod tests {\n    use crate::c::x;\n    const S: &str = \"}\";\n}\n"
            "pub fn after() { crate::b::f() }\n")
        open(os.path.join(d, "b.rs"), "w").write("pub fn f() {}\n")
        open(os.path.join(d, "c.rs"), "w").write("pub fn x() {}\n")
        got = subprocess.run([sys.executable, __file__, "--areas-mermaid", d],
                             capture_output=True, text=True, check=True).stdout
    want = "```mermaid\nflowchart LR\n    a --> b\n```\n"
    if got != want:
        sys.exit(f"import-cycles: self-test failed:\n{got}")
    print("import-cycles: self-test ok")
    sys.exit(0)
doc = None
if args and args[0] == "--areas-mermaid":
    mode, args = "mermaid", args[1:]
elif args and args[0] == "--check-doc":
    if len(args) < 2:
        sys.exit("usage: hack/import-cycles.py --check-doc DOC [src]")
    mode, doc, args = "doc", args[1], args[2:]
root = args[0] if args else "src"
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

# Files their parent declares `#[cfg(test)] mod name;` are test code, and so is all below them.
test_only = set()
for m, f in files.items():
    for name in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s+(\w+)\s*;", open(f).read()):
        test_only.add((m + "::" + name) if m else name)
for m in list(mods):
    if any(m == t or m.startswith(t + "::") for t in test_only):
        mods.discard(m)
        del files[m]


def strip_tests(text):
    # every item under `#[cfg(test)]` blanked to its matching brace (or `;`), wherever it stands:
    # the code after an inline test module is read like the rest (hack/rust_source.py)
    return without_tests(text)


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



def sccs(graph):
    """Strongly connected components of `graph` (node -> set of nodes) with more than one node."""
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]

    def sc(v):
        idx[v] = low[v] = c[0]
        c[0] += 1
        st.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in idx:
            sc(v)
    return [sorted(x) for x in out if len(x) > 1]


sys.setrecursionlimit(10000)
area = lambda m: m.split("::")[0]
areas = {area(m): set() for m in mods}
behind = {}
for a, bs in edges.items():
    for b in bs:
        if area(a) != area(b):
            areas[area(a)].add(area(b))
            behind.setdefault((area(a), area(b)), []).append(f"{a} -> {b}")


def mermaid():
    lines = ["```mermaid", "flowchart LR"]
    for a in sorted(areas):
        for b in sorted(areas[a]):
            lines.append(f"    {a} --> {b}")
    lines.append("```")
    return "\n".join(lines)


if mode == "mermaid":
    print(mermaid())
    sys.exit(0)
if mode == "doc":
    text = open(doc).read()
    begin, end = "<!-- areas:begin -->", "<!-- areas:end -->"
    if begin not in text or end not in text:
        sys.exit(f"{doc}: no {begin} ... {end} section")
    held = text[text.index(begin) + len(begin): text.index(end)].strip()
    if held != mermaid():
        print(f"{doc}: the drawing of the areas is not the code's; regenerate it with\n"
              f"  python3 hack/import-cycles.py --areas-mermaid src\nand paste it between the markers")
        sys.exit(1)
    print(f"{doc}: the drawing of the areas is the code's")
    sys.exit(0)

failed = False
cyc = sccs(edges)
print(f"modules: {len(mods)}, edges: {sum(len(e) for e in edges.values())}")
if not cyc:
    print("import cycles: none")
for comp in cyc:
    failed = True
    s = set(comp)
    print("cycle:", " <-> ".join(comp))
    for a in comp:
        for b in sorted(edges[a] & s):
            print(f"   {a} -> {b}")
acyc = sccs(areas)
print(f"areas: {len(areas)}, arrows: {sum(len(e) for e in areas.values())}")
if not acyc:
    print("area cycles: none")
for comp in acyc:
    failed = True
    s = set(comp)
    print("area cycle:", " <-> ".join(comp))
    for a in comp:
        for b in sorted(areas[a] & s):
            print(f"   {a} -> {b}: " + "; ".join(behind[(a, b)][:5]))
sys.exit(1 if failed else 0)
