"""The checkout as the build checks see it: source roots, the folder walk, Bazel packages and
glob patterns (shared by ci/check_build.py and ci/check_imports.py)."""

from __future__ import annotations

import os
import re

SOURCE_ROOTS = ("python", "kernels", "collectives", "integrations")
CHECKED_TREES = SOURCE_ROOTS + ("ci",)
SKIP_DIRS = {".git", ".venv", ".bazel", ".cache", "__pycache__", ".pytest_cache", "out", "build",
             "node_modules", ".whl", ".gl"}


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
