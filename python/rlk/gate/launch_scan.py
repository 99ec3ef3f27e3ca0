"""Static scans of the kernel sources. L0's launch-site scan: every launch of a strict kernel
pins floating-point fusion. And :func:`host_constexpr_calls` (a test, not a gate check): host code
calls no Triton constexpr helper.

A static scan of an op folder's sources (no import, no compile): each ``kernel[grid](...)`` or
``launch(kernel, grid, ...)`` of a ``@triton.jit`` function must pass ``**launch_options()`` or an explicit ``enable_fp_fusion=``,
so no launch leaves fusion to the toolchain default. Used by :mod:`rlk.gate.crosstarget`'s
compile worker (once per run) over the folders of the registered kernels.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Iterable


def _jit_functions(tree: ast.AST) -> list[ast.FunctionDef]:
    """The functions decorated ``@jit`` / ``@triton.jit`` (with or without arguments)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                if (isinstance(d, ast.Attribute) and d.attr == "jit") or (isinstance(d, ast.Name) and d.id == "jit"):
                    out.append(node)
                    break
    return out


def _jit_names(tree: ast.AST) -> set[str]:
    return {f.name for f in _jit_functions(tree)}


def _sources(folder: str | os.PathLike) -> list[Path]:
    """The scanned sources of a folder: tests and benchmarks left out."""
    return [p for p in sorted(Path(folder).glob("*.py")) if not p.name.endswith(("_test.py", "_bench.py"))]


_CONSTEXPR_HELPERS = {"cdiv", "next_power_of_2"}


def host_constexpr_calls(path: str | os.PathLike) -> list[tuple[int, str]]:
    """(line, call) of ``triton.cdiv`` / ``triton.next_power_of_2`` (or ``tl.``) outside every
    ``@triton.jit`` function of ``path``: on the host they are Triton constexpr functions,
    microseconds per call on every launch (rlk.kernels.common has ``cdiv`` / ``next_pow2``)."""
    tree = ast.parse(Path(path).read_text(), str(path))
    jit_lines = set()
    for f in _jit_functions(tree):
        jit_lines.update(range(f.lineno, f.end_lineno + 1))
    out = []
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        if (isinstance(f, ast.Attribute) and f.attr in _CONSTEXPR_HELPERS and isinstance(f.value, ast.Name)
                and f.value.id in ("triton", "tl") and node.lineno not in jit_lines):
            out.append((node.lineno, ast.unparse(f)))
    return out


_PIN_WORDS = ("launch_options", "enable_fp_fusion")


class _PinResolver:
    """Decides whether a ``**kwargs`` expression of a launch carries the fusion pin: it mentions
    ``launch_options``/``enable_fp_fusion``, calls a function of the same file that does, or is a
    name assigned (in the enclosing function or at module level) from such an expression."""

    def __init__(self, tree: ast.Module):
        self.funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.module_assigns = self._assigns(tree.body)
        self.pinning: set[str] = set()
        changed = True
        while changed:  # functions that pin, directly or through another pinning function
            changed = False
            for name, fn in self.funcs.items():
                if name not in self.pinning and self._pinned(fn, self._assigns(fn.body), set()):
                    self.pinning.add(name)
                    changed = True

    @staticmethod
    def _assigns(body) -> dict[str, list[ast.AST]]:
        out: dict[str, list[ast.AST]] = {}
        for stmt in body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            out.setdefault(t.id, []).append(n.value)
                elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and isinstance(n.target, ast.Name) and n.value:
                    out.setdefault(n.target.id, []).append(n.value)
        return out

    def _pinned(self, expr: ast.AST, local: dict, seen: set) -> bool:
        if any(w in ast.unparse(expr) for w in _PIN_WORDS):
            return True
        for n in ast.walk(expr):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name in self.pinning:
                    return True
            if isinstance(n, ast.Name) and n.id not in seen:
                seen.add(n.id)
                for v in local.get(n.id, []) + self.module_assigns.get(n.id, []):
                    if self._pinned(v, local, seen):
                        return True
        return False

    def launch_pinned(self, call: ast.Call, enclosing) -> bool:
        local = self._assigns(enclosing.body) if enclosing is not None else {}
        return any(kw.arg == "enable_fp_fusion" or (kw.arg is None and self._pinned(kw.value, local, set()))
                   for kw in call.keywords)


def _launched_kernel(node: ast.AST):
    """The kernel expression of a launch: ``k[grid](...)`` or ``launch(k, grid, ...)``
    (:func:`rlk.kernels.launcher.launch`), else None."""
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Subscript):
        return node.func.value
    f = node.func
    if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == "launch" and len(node.args) >= 2:
        return node.args[0]
    return None


def scan_launch_sites(folder: str | os.PathLike, kernel_names: Iterable[str] = ()) -> list[str]:
    """Launches ``k[grid](...)`` or ``launch(k, grid, ...)`` of jit kernels in ``folder`` that
    leave fusion to a default.

    A launch pins fusion when it passes ``enable_fp_fusion=`` or a ``**`` argument carrying
    ``launch_options()`` (see :class:`_PinResolver`). Tests and benchmarks are not scanned.
    """
    files = _sources(folder)
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    names = set(kernel_names)
    for t in trees.values():
        names |= _jit_names(t)
    problems = []
    for p, tree in trees.items():
        res = _PinResolver(tree)
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            callee = _launched_kernel(node)
            if callee is None:
                continue
            name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", None)
            if name not in names:
                continue
            enc = parents.get(node)
            while enc is not None and not isinstance(enc, (ast.FunctionDef, ast.AsyncFunctionDef)):
                enc = parents.get(enc)
            if not res.launch_pinned(node, enc):
                problems.append(
                    f"{p.parent.name}/{p.name}:{node.lineno}: launch of {name} leaves fp fusion to the "
                    "toolchain default (pass **launch_options())"
                )
    return problems
