#!/bin/sh
# rlk does not collect coverage with Bazel 4 (`bazel coverage` is not supported offline).
echo "remote_coverage_tools stand-in: coverage is not collected in rlk's offline Bazel 4 setup" >&2
exit 0
