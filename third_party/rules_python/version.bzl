"""The upstream rules_python release this stand-in mirrors (the one MODULE.bazel pins).

ci/check_build.py checks that MODULE.bazel's bazel_dep on rules_python names this version.
"""

RULES_PYTHON_VERSION = "1.6.3"
