#!/usr/bin/env python3
"""Module-level import cycles in src/ (issue #12): an edge for every `crate::` / `super::` path
outside `#[cfg(test)]` modules (a module and its own parent or child are not counted).
Usage: hack/import-cycles.py [src]"""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "src"
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.relpath(os.path.join(d, f), root)[:-3]
            parts = p.split("/")
            if parts[-1] in ("mod", "lib", "main"): parts = parts[:-1]
            files["::".join(parts)] = os.path.join(d, f)
mods = set(files)
def strip_tests(text):
    # drop everything from the first `#[cfg(test)]` mod tests to the end (convention in this repo)
    m = re.search(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text
def resolve(path):
    parts = path.split("::")
    for n in range(len(parts), 0, -1):
        cand = "::".join(parts[:n])
        if cand in mods: return cand
    return None
edges = {m: set() for m in mods}
for m, f in files.items():
    text = strip_tests(open(f).read())
    text = re.sub(r"//[^\n]*", "", text)
    refs = set(re.findall(r"crate::([A-Za-z_][\w:]*)", text))
    # `use crate::a::{b, c}` groups
    for g, inner in re.findall(r"crate::([\w:]*)::\{([^}]*)\}", text):
        for it in inner.split(","):
            it = it.strip().split(" as ")[0].strip()
            if it and it != "self": refs.add(g + "::" + it)
    # super:: references
    for s in re.findall(r"super::([\w:]+)", text):
        # `super` of a::b (a/b.rs or a/b/mod.rs) is a.
        base = m.split("::")[:-1]
        refs.add("::".join(base + [s]) if base else s)
    for r in refs:
        t = resolve(r.rstrip(":"))
        if t and t != m and not m.startswith(t + "::") and not t.startswith(m + "::"):
            edges[m].add(t)
# Tarjan SCC
idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        out.append(comp)
sys.setrecursionlimit(10000)
for v in sorted(mods):
    if v not in idx: sc(v)
cyc = [sorted(x) for x in out if len(x) > 1]
print(f"modules: {len(mods)}, edges: {sum(len(e) for e in edges.values())}")
if not cyc: print("import cycles: none")
for comp in cyc:
    s = set(comp)
    print("cycle:", " <-> ".join(comp))
    for a in comp:
        for b in sorted(edges[a] & s): print(f"   {a} -> {b}")
