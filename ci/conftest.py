"""The ci/ tests import the scripts beside them (``check_build``, ``pytest_runner``,
``test_summary``) as top-level modules: under ``--import-mode=importlib`` (pyproject.toml) pytest
does not put a test's folder on ``sys.path``, so this folder is added here (Bazel's macro does the
same for its targets)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
