"""The coverage stub as an executable target (Bazel 4's test rules name two of them)."""

def coverage_stub(name):
    # buildifier: disable=native-sh-binary
    native.sh_binary(
        name = name,
        srcs = ["coverage_stub.sh"],
    )
