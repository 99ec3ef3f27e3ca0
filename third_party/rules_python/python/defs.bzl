"""Offline stand-in for @rules_python//python:defs.bzl (Bazel 4, WORKSPACE mode).

Bazel 4 still ships the Python rules natively; this file only re-exports them under the load
path that upstream rules_python uses, so every BUILD file loads from `@rules_python` and stays
valid under Bazel 7+/8 with bzlmod, where MODULE.bazel brings the real rules_python.
"""

def py_library(**kwargs):
    native.py_library(**kwargs)  # buildifier: disable=native-py

def py_binary(**kwargs):
    native.py_binary(**kwargs)  # buildifier: disable=native-py

def py_test(**kwargs):
    native.py_test(**kwargs)  # buildifier: disable=native-py

def py_runtime(**kwargs):
    native.py_runtime(**kwargs)  # buildifier: disable=native-py
