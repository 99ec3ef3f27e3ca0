"""Offline stand-in for @rules_cc//cc:defs.bzl: re-exports Bazel 4's native C++ rules.

rlk builds no C++ with Bazel 4; Bazel's own @bazel_tools loads these names.
"""

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)  # buildifier: disable=native-cc-binary

def cc_import(**kwargs):
    native.cc_import(**kwargs)  # buildifier: disable=native-cc-import

def cc_library(**kwargs):
    native.cc_library(**kwargs)  # buildifier: disable=native-cc-library

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)  # buildifier: disable=native-cc-proto-library

def cc_shared_library(**kwargs):
    native.cc_shared_library(**kwargs)  # buildifier: disable=native-cc-shared-library

def cc_test(**kwargs):
    native.cc_test(**kwargs)  # buildifier: disable=native-cc-test

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)  # buildifier: disable=native-cc-toolchain

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)  # buildifier: disable=native-cc-toolchain-suite

def objc_library(**kwargs):
    native.objc_library(**kwargs)  # buildifier: disable=native-cc-objc-library
