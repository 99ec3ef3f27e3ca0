"""Bazel entry of the release gate (``bazel run //ci:release_gate -- --profile cpu``)."""

from rlk.gate.release_gate import run

if __name__ == "__main__":
    run()
