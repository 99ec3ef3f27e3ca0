"""Maps the one import root ``rlk`` over its four source roots (see ARCHITECTURE.md).

``python/rlk`` holds ``rlk`` itself; ``kernels/rlk/kernels``, ``collectives/rlk/collectives`` and
``integrations/rlk/integrations`` hold sub-packages. Every folder with an ``__init__.py`` below
them becomes a package with its own directory, so Bazel and pip see the same import lines.

The wheel and the sdist hold the library only: every test and tool module (a name matching
``[tool.rlk] leaf_patterns`` in pyproject.toml, the list ci/check_build.py reads too) is left
out, except ``__main__.py``, a package's command line. An editable install maps whole folders,
so tests and tools still run from the checkout.
"""

import fnmatch
import os
import tomllib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOTS = ("python", "kernels", "collectives", "integrations")
# Leaves that stay in the wheel: a package's command line (python -m rlk.<pkg>).
WHEEL_KEEPS = ("__main__.py",)


def leaf_patterns(root: str = HERE) -> tuple[str, ...]:
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tuple(tomllib.load(f)["tool"]["rlk"]["leaf_patterns"])


def is_tool_or_test(filename: str, patterns: tuple[str, ...]) -> bool:
    """True for a module the wheel leaves out (a test or tool file, not ``__main__.py``)."""
    base = os.path.basename(filename)
    return base not in WHEEL_KEEPS and any(fnmatch.fnmatch(base, p) for p in patterns)


class BuildPyLibraryOnly(build_py):
    """build_py without test and tool modules (the sdist lists its files through it too)."""

    def find_package_modules(self, package, package_dir):
        patterns = leaf_patterns()
        return [m for m in super().find_package_modules(package, package_dir)
                if not is_tool_or_test(m[2], patterns)]


def _packages(here: str = HERE):
    pkgs, dirs = [], {}
    for root in ROOTS:
        base = os.path.join(here, root)
        for cur, subdirs, files in os.walk(base):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__")))
            if "__init__.py" not in files:
                continue
            rel = os.path.relpath(cur, base)
            name = rel.replace(os.sep, ".")
            if name.startswith("rlk"):
                pkgs.append(name)
                dirs[name] = os.path.join(root, rel)
    return pkgs, dirs


if __name__ == "__main__":  # setuptools runs this file as __main__; ci/wheel_test.py imports it
    _PKGS, _DIRS = _packages()
    setup(packages=_PKGS, package_dir=_DIRS, cmdclass={"build_py": BuildPyLibraryOnly})
