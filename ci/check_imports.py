"""The import checks of ci/check_build.py: layers and Bazel deps.

  * imports point down the layers of ARCHITECTURE.md (LAYERS below): no upward import, no import
    cycle, function-level imports included; tests and tools (LEAF_PATTERNS: pyproject.toml
    [tool.rlk]) are leaves; the known exceptions are IMPORT_ALLOWLIST's, each with its reason;
    ARCHITECTURE.md's layer table matches LAYERS;
  * every rlk module that a py_library/py_test/py_binary's srcs import (lazily or under
    try/except ImportError too) is in the srcs or data of the target or of its transitive deps:
    Bazel's sandbox holds nothing else, so a missing dep fails only under `bazel test`.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import tomllib

from build_tree import CHECKED_TREES, SOURCE_ROOTS, _glob_match, _package_of, _read, _walk


# --- import layers -------------------------------------------------------------------------
# The layer order of ARCHITECTURE.md ("Layers"), lowest first. A module belongs to the layer of
# the longest entry that names it (an entry names a module and everything below it; the root
# entry "rlk" names only rlk/__init__.py). A module may import its own layer and the layers below
# it, never one above. Every `import rlk...` / `from rlk... import` counts, at any depth (a lazy
# import inside a function is still a dependency).
ROOT_PACKAGE = "rlk"
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", (ROOT_PACKAGE, "rlk.errors", "rlk.contracts", "rlk.determinism", "rlk.testing")),
    ("kernels", ("rlk.kernels", "rlk.testing.timing")),
    ("collectives", ("rlk.collectives",)),
    ("model", ("rlk.nn", "rlk.models")),
    ("provenance", ("rlk.provenance",)),
    ("harness", ("rlk.replay", "rlk.bench", "rlk.gate", "rlk.rl", "rlk.collectives.checks")),
    ("integrations", ("rlk.integrations",)),
)


def leaf_patterns(root: str) -> tuple[str, ...]:
    """pyproject.toml's ``[tool.rlk] leaf_patterns``: the one list (setup.py's wheel filter
    reads it too)."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tuple(tomllib.load(f)["tool"]["rlk"]["leaf_patterns"])


# Tests and tools are leaves, above every layer: they may import any module; a library module
# that imports one is an upward import. A file is a leaf when its name matches one of these.
LEAF_PATTERNS = leaf_patterns(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LEAVES = "tools"
# Imports that break the order and stay for now: (importer, imported) -> why. Only ever shrinks;
# an entry that no longer matches an import is itself an error.
IMPORT_ALLOWLIST: dict[tuple[str, str], str] = {}


def module_name(rel: str) -> str:
    """``python/rlk/a/b.py`` -> ``rlk.a.b``; a package's ``__init__.py`` -> the package."""
    parts = rel[:-3].split("/")[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_leaf(rel: str) -> bool:
    return any(fnmatch.fnmatch(os.path.basename(rel), p) for p in LEAF_PATTERNS)


def layer_of(module: str, rel: str | None = None) -> tuple[int, str] | None:
    """(rank, name) of `module`'s layer; leaves rank above every layer; None when unmapped."""
    if rel is not None and is_leaf(rel):
        return len(LAYERS), LEAVES
    best = None
    for rank, (name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = module == p or (p != ROOT_PACKAGE and module.startswith(p + "."))
            if hit and (best is None or len(p) > best[0]):
                best = (len(p), rank, name)
    return None if best is None else (best[1], best[2])


def rlk_modules(root: str) -> dict[str, str]:
    """Every module under the source roots: dotted name -> path relative to `root`."""
    out = {}
    for top in SOURCE_ROOTS:
        for cur, files in _walk(root, top):
            for f in sorted(files):
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(cur, f), root).replace(os.sep, "/")
                    if rel.count("/") >= 2:  # <root>/rlk/...
                        out.setdefault(module_name(rel), rel)
    return out


def rlk_imports(module: str, rel: str, tree: ast.AST, known: dict[str, str]) -> list[tuple[str, int]]:
    """(imported module, line) for every rlk import in `tree`, at any nesting depth.
    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module."""
    pkg = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "rlk"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "rlk":
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((sub if sub in known else mod, node.lineno))
    return out


def import_graph(root: str) -> tuple[dict[str, str], dict[str, list[tuple[str, int]]], list[str]]:
    """(modules, edges, parse errors): edges[m] lists (imported module, line) per rlk import of m."""
    known = rlk_modules(root)
    edges, errs = {}, []
    for mod, rel in known.items():
        try:
            tree = ast.parse(_read(os.path.join(root, rel)) or "", filename=rel)
        except SyntaxError as e:
            errs.append(f"{rel}:{e.lineno}: cannot parse ({e.msg}), so its imports are unchecked")
            tree = ast.Module(body=[], type_ignores=[])
        edges[mod] = sorted({(t, n) for t, n in rlk_imports(mod, rel, tree, known) if t != mod},
                            key=lambda x: (x[1], x[0]))
    return known, edges, errs


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative), sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
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
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _cycle_path(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle through the first module of the strongly connected `comp`, as a closed path."""
    start, inside = comp[0], set(comp)
    prev, queue = {start: None}, [start]
    for v in queue:  # breadth first: the shortest way back to `start`
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in inside and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp + comp[:1]


def check_layers(root: str, allowlist: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Upward imports between the layers of LAYERS, imports of leaves (tests, tools) from the
    library, unmapped modules and import cycles; `allowlist` entries are skipped (and reported
    when stale)."""
    allow = IMPORT_ALLOWLIST if allowlist is None else allowlist
    known, edges, errs = import_graph(root)
    used, graph = set(), {}
    for mod, rel in sorted(known.items()):
        src = layer_of(mod, rel)
        if src is None:
            errs.append(f"{rel}: module {mod} is in no layer (ci/check_build.py LAYERS)")
            continue
        for target, line in edges[mod]:
            if (mod, target) in allow:
                used.add((mod, target))
                continue
            graph.setdefault(mod, set()).add(target)
            dst = layer_of(target, known.get(target))
            if dst is None:
                continue  # not a module of the tree (reported for its own file when it is one)
            if dst[0] > src[0]:
                errs.append(f"{rel}:{line}: upward import {mod} ({src[1]}) -> {target} ({dst[1]})")
    for comp in _cycles(graph):
        errs.append("import cycle: " + " -> ".join(_cycle_path(comp, graph)))
    for key in sorted(set(allow) - used):
        errs.append(f"IMPORT_ALLOWLIST entry {key[0]} -> {key[1]} no longer matches an import: remove it")
    return errs


def check_architecture_doc(root: str) -> list[str]:
    """ARCHITECTURE.md's "Layers" table names the layers of LAYERS in order, each with exactly its
    module entries, and the text names every leaf pattern: the document and the check agree."""
    text = _read(os.path.join(root, "ARCHITECTURE.md"))
    if text is None:
        return ["ARCHITECTURE.md is missing (it documents the layer order check_layers enforces)"]
    m = re.search(r"^## Layers.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        return ["ARCHITECTURE.md has no '## Layers' section"]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in m.group(1).splitlines() if re.match(r"\|\s*`", line)]
    errs = []
    names = [r[0].strip("`") for r in rows]
    want = [n for n, _ in LAYERS] + [LEAVES]
    if names != want:
        errs.append(f"ARCHITECTURE.md's layer table lists {names}, ci/check_build.py LAYERS {want}")
    for (name, prefixes), row in zip(LAYERS, rows):
        doc = set(re.findall(r"`(rlk(?:\.\w+)*)`", row[1])) if len(row) > 1 else set()
        if row[0].strip("`") == name and doc != set(prefixes):
            errs.append(f"ARCHITECTURE.md's layer {name} lists {sorted(doc)}, LAYERS {sorted(prefixes)}")
    for pat in LEAF_PATTERNS:
        if f"`{pat}`" not in m.group(1):
            errs.append(f"ARCHITECTURE.md's Layers section does not name the leaf pattern `{pat}`")
    return errs


# --- target deps ---------------------------------------------------------------------------
PY_RULES = ("py_library", "py_test", "py_binary", "rlk_py_library", "rlk_py_test", "rlk_py_binary")
Targets = dict[str, dict[str, list[str]]]  # label -> {"srcs", "data": paths from the root; "deps": labels}


class _Opaque:
    """A value a BUILD file gets from outside itself (a loaded symbol, requirement(...), another
    rule): callable, iterable as empty and dropped from a `+`, so never taken for a label."""

    def __call__(self, *args, **kwargs):
        return self

    def __add__(self, other):
        return other

    __radd__ = __add__

    def __iter__(self):
        return iter(())


class _BuildNamespace(dict):
    """A BUILD file's globals: a name that it neither defines nor gets from here is _Opaque."""

    def __missing__(self, name):
        return _Opaque()


def _label(pkg: str, label: str) -> tuple[str, str] | None:
    """(package, name) of a label written in package `pkg` ("//a/b" is "//a/b:b"); None for
    another repository's (@pypi//torch)."""
    label = label[1:] if label.startswith("@//") else label
    if label.startswith("@"):
        return None
    if label.startswith("//"):
        p, _, n = label[2:].partition(":")
        return p, n or p.rsplit("/", 1)[-1]
    return pkg, label.lstrip(":")


def _eval_build(root: str, pkg: str, path: str, targets: Targets) -> None:
    """Record the Python targets of one BUILD file. The file runs as Python (these files' Starlark
    is a subset of it: comprehensions over globs, `+`, `%`) with recorders for the Python rules, a
    glob() that stops at subpackages as Bazel's does, and no builtins but len and str."""
    def glob(include, exclude=(), **_):
        out = []
        for cur, files in _walk(root, pkg):
            for f in files:
                rel = os.path.relpath(os.path.join(cur, f), root).replace(os.sep, "/")
                name = rel[len(pkg) + 1:]
                if (_package_of(root, rel) == pkg and any(_glob_match(name, p) for p in include)
                        and not any(_glob_match(name, p) for p in exclude)):
                    out.append(name)
        return sorted(out)

    def labels(items):
        return [lb for s in items if isinstance(s, str) and (lb := _label(pkg, s))]

    def rule(name, srcs=(), deps=(), data=(), **_):
        targets[f"//{pkg}:{name}"] = {"srcs": [f"{p}/{n}".lstrip("/") for p, n in labels(srcs)],
                                      "data": [f"{p}/{n}".lstrip("/") for p, n in labels(data)],
                                      "deps": [f"//{p}:{n}" for p, n in labels(deps)]}

    ns = _BuildNamespace({r: rule for r in PY_RULES}, glob=glob, len=len, str=str, __builtins__={})
    exec(compile(_read(path) or "", path, "exec"), ns)


def build_targets(root: str) -> tuple[Targets, list[str]]:
    """(the Python targets of the BUILD files under CHECKED_TREES, files that failed to evaluate)."""
    targets, errs = {}, []
    for top in CHECKED_TREES:
        for cur, files in _walk(root, top):
            build = next((b for b in ("BUILD.bazel", "BUILD") if b in files), None)
            if build is None:
                continue
            pkg = os.path.relpath(cur, root).replace(os.sep, "/")
            try:
                _eval_build(root, pkg, os.path.join(cur, build), targets)
            except Exception as e:  # any failure leaves the package's deps unchecked: say so
                errs.append(f"{pkg}/{build}: cannot evaluate ({e!r}), so its targets' deps are unchecked")
    return targets, errs


def _closure_files(label: str, targets: Targets) -> set[str]:
    """srcs and data (both in the runfiles, so importable) of `label` and of its transitive deps."""
    seen, todo, out = {label}, [label], set()
    while todo:
        t = targets.get(todo.pop(), {})  # {}: not a Python target (a filegroup)
        out.update(t.get("srcs", ()), t.get("data", ()))
        todo += [d for d in t.get("deps", ()) if d not in seen]
        seen.update(t.get("deps", ()))
    return out


def check_target_deps(root: str) -> list[str]:
    """Every rlk module that a Python target's srcs import must be in the srcs or data of the
    target or of a target in its transitive deps: Bazel's sandbox holds only those, so a missing
    dep fails only under `bazel test`. Lazy imports and those under try/except ImportError count.
    A module that no target holds is check_coverage's to report."""
    targets, errs = build_targets(root)
    known, edges, _ = import_graph(root)  # parse errors are check_layers'
    module_of = {rel: mod for mod, rel in known.items()}
    owner = {}
    for label, t in sorted(targets.items()):
        for rel in t["srcs"]:
            owner.setdefault(rel, label)
    for label, t in sorted(targets.items()):
        provided = _closure_files(label, targets)
        for rel in t["srcs"]:
            if rel in module_of:
                imports = edges[module_of[rel]]
            else:  # outside the source roots (ci/); a file that does not parse imports nothing here
                try:
                    imports = rlk_imports("", rel, ast.parse(_read(os.path.join(root, rel)) or ""), known)
                except (SyntaxError, ValueError):
                    imports = []
            for mod, line in imports:
                if known.get(mod) in owner and known[mod] not in provided:
                    errs.append(f"{label}: {rel}:{line} imports {mod}, which no target in its deps "
                                f"closure provides (it is in {owner[known[mod]]})")
    return errs
