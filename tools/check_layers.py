#!/usr/bin/env python3
"""check_layers.py - kiln's layering check (DESIGN.md, "Layers").

    check_layers.py BUILD_DIR SOURCE_DIR [--allow FILE] [--nm NM] [--strict-allow]

Fails (exit 1) on any violation not in the allowlist (SOURCE_DIR/tools/layers_allow.txt):

  a) layer: a file under src/ includes a header of a layer it must not (the LAYERS table below:
     a layer may include its own headers and those of lower layers, less the exceptions in
     NOT_BELOW and ONLY; include/kiln.h everywhere);
  b) include cycle: headers of src/ that include each other in a loop (a strongly connected
     component of the include graph, or a file that includes itself);
  c) call circle: source files of src/ whose object files use each other's global symbols in
     a loop (a strongly connected component of more than one file of the graph "object A has
     an undefined symbol that object B defines", from `nm` on every .o under
     BUILD_DIR/src/CMakeFiles/*.dir/; Tarjan). This is what farm-studio calls a circle. It
     sees only code the build compiled (an #if branch not taken draws no arrow).

Every violation is printed on its own line(s), allowed ones marked "(allowed: FILE:LINE)".
Allowlist entries that match nothing are reported as stale; --strict-allow fails on them.
Exit status: 0 clean, 1 violations, 2 usage or tool errors.
"""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

# ---- the layer table (edit here) ----------------------------------------------------------
#
# Lowest first. A file may include headers of its own layer and of layers of a lower rank;
# layers of equal rank may not include each other. Files: globs relative to src/ ("*" stays
# within one directory, "**" crosses directories, a leading "!" excludes); the first layer
# whose globs take a file owns it. A file of src/ that no layer owns is itself a violation.
LAYERS = [
    # rank, layer,         files
    (0, "util", ["util/**"]),
    (1, "tensor", ["tensor/**"]),
    (2, "format", ["format/**"]),
    (3, "tokenizer", ["tokenizer/**"]),
    (4, "template", ["template/**"]),
    # the interface: backend.h (the ops table), batch.h
    (5, "backend", ["backend/*", "!backend/runner*", "!backend/registry*", "!backend/loader*"]),
    (6, "kv", ["kv/**"]),
    (7, "backend/cpu", ["backend/cpu/**"]),
    (7, "backend/cuda", ["backend/cuda/**"]),
    (8, "model", ["model/**"]),
    # the runner, and what names each backend: the registry and the model loader
    (9, "runner", ["backend/runner*", "backend/registry*", "backend/loader*"]),
    (10, "grammar", ["grammar/**"]),
    (11, "engine", ["engine/**"]),
    (12, "server", ["server/**"]),
    (13, "cli", ["cli/**"]),
]

# Lower layers a layer still must not include. DESIGN.md: "Nothing under src/model ... names a
# backend's headers".
NOT_BELOW = {
    "model": ["backend/cpu", "backend/cuda"],
}

# Layers that may include only the layers listed (their own included), whatever their rank.
# DESIGN.md: "The server reaches the engine and the model only through include/kiln.h".
ONLY = {
    "server": ["server", "util"],
}

# Headers outside src/ that every file may include (paths relative to SOURCE_DIR).
ANYWHERE = ["include/kiln.h"]

SOURCE_EXT = (".c", ".h", ".inc", ".cu", ".cuh")

# ---- files and layers ---------------------------------------------------------------------


def die(msg):
    print("check_layers: " + msg, file=sys.stderr)
    sys.exit(2)


def glob_re(pattern):
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


_LAYER_RES = [
    (rank, name, [(g.startswith("!"), glob_re(g.lstrip("!"))) for g in globs])
    for rank, name, globs in LAYERS
]
RANK = {name: rank for rank, name, _ in LAYERS}


def layer_of(rel_src):
    """The layer owning src/<rel_src>, or None."""
    for _, name, pats in _LAYER_RES:
        inc = any(p.match(rel_src) for neg, p in pats if not neg)
        exc = any(p.match(rel_src) for neg, p in pats if neg)
        if inc and not exc:
            return name
    return None


def may_include(frm, to):
    """Whether layer frm may include layer to; the reason when not."""
    if frm == to:
        return True, ""
    if frm in ONLY:
        if to in ONLY[frm]:
            return True, ""
        return False, "%s may include only %s and %s" % (frm, ", ".join(ONLY[frm]), ANYWHERE[0])
    if to in NOT_BELOW.get(frm, []):
        return False, "%s must not include %s" % (frm, to)
    if RANK[to] < RANK[frm]:
        return True, ""
    if RANK[to] == RANK[frm]:
        return False, "%s and %s are of equal rank" % (frm, to)
    return False, "%s is below %s" % (frm, to)


def strip_comments(text):
    """text with C comments blanked (newlines kept), string and char literals left alone."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def includes_of(path):
    """[(line, written)] of the quoted #include lines of a file."""
    text = strip_comments(path.read_text(encoding="utf-8", errors="replace"))
    res = []
    for m in INCLUDE_RE.finditer(text):
        res.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return res


def resolve(src_root, inc_root, includer, written):
    """Repo-relative path of an included file (as the compiler finds it: the includer's
    directory, then src/ and include/); for a file not there, the path under src/ when its
    first directory names a layer's directory, else None."""
    for base in (includer.parent, src_root, inc_root):
        p = (base / written).resolve()
        if p.is_file():
            return p
    first = written.split("/", 1)[0]
    if "/" in written and (src_root / first).is_dir():
        return (src_root / written).resolve()
    return None


# ---- strongly connected components (Tarjan, iterative) ------------------------------------


def tarjan(nodes, edges):
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


# ---- the allowlist ------------------------------------------------------------------------


class Allow:
    """tools/layers_allow.txt: `include FILE HEADER`, `cycle FILE...`, `circle FILE...`
    (repo-relative paths; '#' starts a comment). A cycle or circle entry covers any cycle or
    circle among some of its files."""

    def __init__(self, path):
        self.path = path
        self.entries = []  # [kind, files, line, used]
        if path is None or not path.exists():
            return
        for no, line in enumerate(path.read_text().splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            kind, files = words[0], words[1:]
            bad = kind not in ("include", "cycle", "circle")
            if bad or (kind == "include" and len(files) != 2):
                die("%s:%d: bad entry: %s" % (path, no, line.strip()))
            self.entries.append([kind, files, no, False])

    def match(self, kind, files):
        for e in self.entries:
            if e[0] != kind:
                continue
            ok = e[1] == list(files) if kind == "include" else set(files) <= set(e[1])
            if ok:
                e[3] = True
                return "%s:%d" % (self.path.name, e[2])
        return None

    def stale(self):
        return [e for e in self.entries if not e[3]]


# ---- the checks ---------------------------------------------------------------------------


def check_includes(root, report):
    src_root, inc_root = root / "src", root / "include"
    anywhere = {(root / a).resolve() for a in ANYWHERE}
    files = sorted(p for p in src_root.rglob("*") if p.is_file() and p.suffix in SOURCE_EXT)
    graph = {}
    lines = {}
    for f in files:
        rel = f.relative_to(src_root).as_posix()
        frm = layer_of(rel)
        if frm is None:
            report("layer", [f.relative_to(root).as_posix()],
                   "%s: in no layer of the table in tools/check_layers.py" % f.relative_to(root))
            continue
        for line, written in includes_of(f):
            tgt = resolve(src_root, inc_root, f, written)
            if tgt is None:
                continue  # a system or generated header
            if tgt in anywhere:
                continue
            try:
                trel = tgt.relative_to(src_root).as_posix()
            except ValueError:
                pair = [f.relative_to(root).as_posix(), tgt.relative_to(root).as_posix()]
                report("include", pair,
                       '%s:%d: #include "%s": outside src/ and not in ANYWHERE'
                       % (f.relative_to(root), line, written))
                continue
            if tgt.is_file():
                graph.setdefault(f, set()).add(tgt)
                lines[(f, tgt)] = (line, written)
            to = layer_of(trel)
            if to is None:
                continue  # reported as a file in no layer
            ok, why = may_include(frm, to)
            if not ok:
                report("include", [f.relative_to(root).as_posix(), "src/" + trel],
                       '%s -> src/%s: %s (#include "%s", line %d)'
                       % (f.relative_to(root), trel, why, written, line))
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})
    for comp in tarjan(nodes, graph):
        if len(comp) == 1 and comp[0] not in graph.get(comp[0], ()):
            continue
        cs = set(comp)
        rels = [c.relative_to(root).as_posix() for c in comp]
        detail = ["include cycle of %d file(s): %s" % (len(comp), ", ".join(rels))]
        for a in comp:
            for b in sorted(graph.get(a, ())):
                if b in cs:
                    ln, w = lines[(a, b)]
                    detail.append('  %s -> %s: #include "%s" (line %d)'
                                  % (a.relative_to(root), b.relative_to(root), w, ln))
        report("cycle", rels, "\n".join(detail))


def nm_symbols(nm, objs):
    """{obj: (defined, undefined)} global symbols of each object file, from `nm -g -P -A`."""
    res = {str(o): (set(), set()) for o in objs}
    names = sorted(res, key=len, reverse=True)
    objs = list(objs)
    for k in range(0, len(objs), 256):
        chunk = [str(o) for o in objs[k : k + 256]]
        out = subprocess.run([nm, "-g", "-P", "-A"] + chunk, capture_output=True, text=True)
        if out.returncode != 0:
            die("%s failed: %s" % (nm, out.stderr.strip()))
        obj = None
        for line in out.stdout.splitlines():
            if obj is None or not line.startswith(obj + ":"):  # lines come grouped by object
                obj = next((o for o in names if line.startswith(o + ":")), None)
                if obj is None:
                    continue
            parts = line[len(obj) + 1 :].split()
            if len(parts) < 2:
                continue
            name, kind = parts[0], parts[1]
            res[obj][1 if kind in ("U", "w", "v") else 0].add(name)
    return res


def check_calls(root, build, nm, report):
    cm = build / "src" / "CMakeFiles"
    objs = {}
    for d in sorted(cm.glob("*.dir")):
        for o in sorted(d.rglob("*.o")):
            rel = o.relative_to(d).as_posix()[: -len(".o")]
            src = root / "src" / rel
            if src.is_file():  # objects of deleted sources may linger in a build tree
                objs[src.relative_to(root).as_posix()] = o
    if not objs:
        die("no object files under %s (build first)" % cm)
    defs, undefs = {}, {}
    table = nm_symbols(nm, objs.values())
    for src, o in objs.items():
        d, u = table[str(o)]
        undefs[src] = u
        for s in d:
            defs.setdefault(s, set()).add(src)
    graph, syms = {}, {}
    for src, us in undefs.items():
        for s in us:
            for t in defs.get(s, ()):
                if t != src:
                    graph.setdefault(src, set()).add(t)
                    syms.setdefault((src, t), set()).add(s)
    for comp in tarjan(sorted(objs), graph):
        if len(comp) < 2:
            continue
        cs = set(comp)
        detail = ["call circle of %d files: %s" % (len(comp), ", ".join(comp))]
        for a in comp:
            for b in sorted(graph.get(a, ())):
                if b in cs:
                    names = sorted(syms[(a, b)])
                    more = " and %d more" % (len(names) - 8) if len(names) > 8 else ""
                    detail.append("  %s -> %s: %s%s" % (a, b, ", ".join(names[:8]), more))
        report("circle", comp, "\n".join(detail))
    return len(objs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_dir", type=Path)
    ap.add_argument("source_dir", type=Path)
    ap.add_argument("--allow", type=Path,
                    help="allowlist (default SOURCE_DIR/tools/layers_allow.txt)")
    ap.add_argument("--nm", default=os.environ.get("NM", "nm"))
    ap.add_argument("--strict-allow", action="store_true", help="fail on stale allowlist entries")
    a = ap.parse_args()
    root, build = a.source_dir.resolve(), a.build_dir.resolve()
    if not (root / "src").is_dir():
        die("%s has no src/" % root)
    allow = Allow(a.allow if a.allow else root / "tools" / "layers_allow.txt")
    counts = {"bad": 0, "allowed": 0}

    def report(kind, files, text):
        where = allow.match(kind, files)
        if where:
            counts["allowed"] += 1
            first, _, rest = text.partition("\n")
            print("%s (allowed: %s)%s" % (first, where, "\n" + rest if rest else ""))
        else:
            counts["bad"] += 1
            print(text)

    print("-- includes (layer order: %s)" % " < ".join(
        "/".join(n for r2, n, _ in LAYERS if r2 == r) for r in sorted({r for r, _, _ in LAYERS})))
    check_includes(root, report)
    print("-- call circles (nm on objects under %s)" % (build / "src" / "CMakeFiles"))
    n_obj = check_calls(root, build, a.nm, report)
    stale = allow.stale()
    for kind, files, no, _ in stale:
        print("stale allowlist entry %s:%d: %s %s (matches nothing: delete it)"
              % (allow.path.name, no, kind, " ".join(files)))
    bad = counts["bad"] + (len(stale) if a.strict_allow else 0)
    print("check_layers: %d violation(s), %d allowed, %d stale allowlist entr%s; %d objects read"
          % (counts["bad"], counts["allowed"], len(stale), "y" if len(stale) == 1 else "ies",
             n_obj))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
