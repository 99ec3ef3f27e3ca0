"""Prints rlk's shared hash-locked requirements minus the packages an engine stack pins itself.

    python3 lock_subtract.py requirements.lock [--engine engine.lock] [--drop torch,triton] > rest.lock

Used inside the rlk-h200 and rlk-mi300x recipes: every image installs the same
third_party/requirements.lock (--require-hashes --no-deps); only the entries that the image's
engine already pins (vLLM's exact torch, the base image's ROCm torch) are left out, by name.
Standard library only (runs with the image's bare python3).
"""

import argparse
import re
import sys


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(path):
    """[(name, [lines])] of a pip-compile lock: a pin line and its continuation lines."""
    out, cur = [], None
    for line in open(path):
        m = re.match(r"^([A-Za-z0-9_.\-]+)==", line)
        if m:
            cur = (norm(m.group(1)), [line])
            out.append(cur)
        elif cur is not None and line.startswith((" ", "\t")) and "--hash=" in line:
            cur[1].append(line)
        else:
            cur = None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lock")
    ap.add_argument("--engine", default=None)
    ap.add_argument("--drop", default="")
    a = ap.parse_args()
    drop = {norm(x) for x in a.drop.split(",") if x}
    if a.engine:
        drop |= {n for n, _ in entries(a.engine)}
    kept = [(n, lines) for n, lines in entries(a.lock) if n not in drop]
    for _, lines in kept:
        sys.stdout.write("".join(lines).rstrip(" \\\n") + "\n" if len(lines) == 1 else "".join(lines))
    sys.stderr.write(f"lock_subtract: kept {len(kept)}, left out {sorted(drop & {n for n, _ in entries(a.lock)})}\n")


if __name__ == "__main__":
    main()
