"""Maps the one import root ``rlk`` over its four source roots (see ARCHITECTURE.md).

``python/rlk`` holds ``rlk`` itself; ``kernels/rlk/kernels``, ``collectives/rlk/collectives`` and
``integrations/rlk/integrations`` hold sub-packages. Every folder with an ``__init__.py`` below
them becomes a package with its own directory, so Bazel and pip see the same import lines.
"""

import os

from setuptools import setup

ROOTS = ("python", "kernels", "collectives", "integrations")


def _packages():
    pkgs, dirs = [], {}
    here = os.path.dirname(os.path.abspath(__file__))
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


_PKGS, _DIRS = _packages()
setup(packages=_PKGS, package_dir=_DIRS)
