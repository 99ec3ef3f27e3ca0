"""The byte corpus of ``rlk.models.train_tiny_tune``: the running Python's top-level standard-library
sources, split into train and validation text, with a hash that pins the text (it differs between
Python versions) and a guard against training on another one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import sysconfig

CORPUS_NAME = "cpython-stdlib-toplevel-py"
TRAIN_BYTES = 3_000_000
VAL_BYTES = 200_000
VAL_EVERY, VAL_INDEX = 10, 5


@dataclasses.dataclass(frozen=True)
class Corpus:
    name: str
    train: bytes
    val: bytes
    meta: dict

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.train + b"\0" + self.val).hexdigest()


def stdlib_corpus(train_bytes: int = TRAIN_BYTES, val_bytes: int = VAL_BYTES) -> Corpus:
    """The running Python's top-level stdlib sources: train and validation bytes (see module doc)."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in os.listdir(root) if f.endswith(".py"))
    parts: dict[str, list[str]] = {"train": [], "val": []}
    for i, f in enumerate(files):
        parts["val" if i % VAL_EVERY == VAL_INDEX else "train"].append(f)

    def text(names, budget):
        out = bytearray()
        for n in names:
            if len(out) >= budget:
                break
            with open(os.path.join(root, n), "rb") as fh:
                out += fh.read() + b"\n"
        if len(out) < budget:
            raise RuntimeError(f"stdlib at {root} has {len(out)} bytes for a {budget}-byte budget")
        return bytes(out[:budget])

    train, val = text(parts["train"], train_bytes), text(parts["val"], val_bytes)
    meta = {
        "name": CORPUS_NAME,
        "what": "top-level *.py files of the Python standard library (sysconfig 'stdlib' path), sorted by "
                f"name; file index % {VAL_EVERY} == {VAL_INDEX} held out for validation; each part "
                "concatenated (one newline after each file) and cut to its byte budget",
        "python": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "files": len(files),
        "val_files": parts["val"],
        "train_bytes": len(train),
        "val_bytes": len(val),
    }
    c = Corpus(CORPUS_NAME, train, val, meta)
    meta["sha256"] = c.sha256
    return c


def check_corpus(corpus: Corpus, results_json: str, allow_change: bool) -> None:
    """Stops when the corpus differs from the one recorded in ``results_json`` (if any)."""
    if not os.path.exists(results_json):
        return
    with open(results_json) as f:
        rec = json.load(f).get("corpus", {})
    if rec.get("sha256") in (None, corpus.sha256):
        return
    msg = (f"corpus {corpus.name} has sha256 {corpus.sha256[:16]}... under Python {corpus.meta.get('python')}, "
           f"but {results_json} records {str(rec.get('sha256'))[:16]}... (Python {rec.get('python')}): the "
           "standard library text differs, so the run would not reproduce the checked-in checkpoint")
    if not allow_change:
        raise SystemExit(f"error: {msg}. Use that Python, or pass --allow-corpus-change to train anyway.")
    print(f"warning: {msg}", file=sys.stderr)
