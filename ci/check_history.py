"""No history in code: comments, docstrings and evidence strings say what is and why, never when
or who.

    python3 ci/check_history.py [--root DIR]

Each hit is one line ``path:line: <what>: <text>`` (exit 1 when any). Checked: the comments and
string literals of every .py file, and every line of the shell and Starlark files (.sh, .bzl,
BUILD.bazel), under the source roots (python/, kernels/, collectives/, integrations/) and ci/.
A hit is
  * a calendar date (YYYY-MM-DD),
  * an issue or pull-request number (``issue #N``, ``issue N``, ``#N``),
  * a session number (``session N``, ``the Nth session``),
  * a run-numbered narrative (``runN``),
  * an author (``the`` followed by ``lead``: who asked for or ran something).
A results file or folder cited by its path (``docs/results/...``, or any name ending in .json,
.md, .csv, .png, .log) is a stable name for an archived run and may hold a date; the text around
it must still not narrate. History belongs in git log and in ``docs/results/**/README.md``
(results files are written by code, and their READMEs are the place for history), so
``docs/results`` is not checked. Narration without such a marker ("was N", "previously") is left
to review.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import tokenize

SOURCE_ROOTS = ("python", "kernels", "collectives", "integrations")
CHECKED_TREES = SOURCE_ROOTS + ("ci",)
SKIP_DIRS = {".git", ".venv", ".bazel", ".cache", "__pycache__", ".pytest_cache", "out", "build",
             "node_modules", ".whl", ".gl", "results"}
LINE_FILES = (".sh", ".bzl", "BUILD.bazel", "BUILD")
# This check's own test writes synthetic files that hold every marker.
EXEMPT = ("ci/check_history_test.py",)

# A cited path or results file name (stable names; they may contain a date or a run number).
_CITED = re.compile(r"[\w./*{}\[\]-]*docs/results/[\w./*{}\[\]-]*"
                    r"|[\w./*{}\[\]-]+\.(?:json|md|csv|png|log)\b")
PATTERNS = (
    ("date", re.compile(r"\b20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b")),
    ("issue number", re.compile(r"\b(?:issue|pr|pull request)s?\s*#?\d+\b|(?<![\w&#/])#\d+\b",
                                re.IGNORECASE)),
    ("session number", re.compile(
        r"\bsessions?\s*#?\d+\b|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|"
        r"tenth|\d+(?:st|nd|rd|th))\s+session\b", re.IGNORECASE)),
    ("run number", re.compile(r"\brun\d+\b", re.IGNORECASE)),
    ("author", re.compile(r"\bthe lead\b", re.IGNORECASE)),
)


def hits_in_text(text: str) -> list[tuple[str, str]]:
    """(kind, matched text) for every history marker in ``text`` (cited paths removed first)."""
    bare = _CITED.sub(" ", text)
    return [(kind, m.group(0)) for kind, rx in PATTERNS for m in rx.finditer(bare)]


def _python_texts(source: str):
    """(line, text) of every comment and string literal (f-string text included)."""
    kinds = {tokenize.COMMENT, tokenize.STRING}
    kinds.add(getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in kinds:
                for i, line in enumerate(tok.string.splitlines() or [""]):
                    yield tok.start[0] + i, line
    except (tokenize.TokenError, SyntaxError, IndentationError):
        # Not tokenizable: fall back to every line (the file fails elsewhere anyway).
        yield from enumerate(source.splitlines(), 1)


def check_file(path: str, rel: str | None = None) -> list[str]:
    rel = rel or path
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError):
        return []
    if path.endswith(".py"):
        texts = _python_texts(source)
    elif path.endswith(LINE_FILES):
        texts = enumerate(source.splitlines(), 1)
    else:
        return []
    out = []
    for lineno, text in texts:
        for kind, found in hits_in_text(text):
            out.append(f"{rel}:{lineno}: {kind} {found!r}: {text.strip()[:120]}")
    return out


def check_tree(root: str, trees=CHECKED_TREES) -> list[str]:
    out = []
    for top in trees:
        for cur, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith((".bazel", ".venv"))
                             and not d.endswith(".egg-info"))
            for name in sorted(files):
                path = os.path.join(cur, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if rel not in EXEMPT:
                    out += check_file(path, rel)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args(argv)
    hits = check_tree(args.root)
    for h in hits:
        print(f"check_history: {h}")
    print(f"check_history: {'OK' if not hits else f'{len(hits)} hit(s)'}")
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())
