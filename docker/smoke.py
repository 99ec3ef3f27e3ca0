"""Imports smoke test run inside an rlk image (no GPU needed).

    python /opt/rlk/smoke.py [--require vllm,megatron.core] [--out DIR]

Imports rlk, torch, triton (and the modules named by --require), builds two capability records
(routes strict and native) and checks that they are paired: identical apart from the route, and
that both carry the image tag and inputs digest from RLK_IMAGE_TAG / RLK_IMAGE_DIGEST. Prints
one JSON object; exit status 0 only if everything held.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--require", default="", help="comma-separated extra modules to import")
    ap.add_argument("--out", default=None, help="folder for smoke.json")
    args = ap.parse_args()
    res: dict = {"imports": {}, "problems": []}
    for mod in ["rlk", "torch", "triton", "numpy", *filter(None, args.require.split(","))]:
        try:
            m = importlib.import_module(mod)
            res["imports"][mod] = getattr(m, "__version__", "?")
        except Exception as e:  # recorded, fails the smoke
            res["imports"][mod] = None
            res["problems"].append(f"import {mod}: {type(e).__name__}: {e}")
    if not res["problems"]:
        from rlk import provenance

        a = provenance.capability_record(route="strict")
        b = provenance.capability_record(route="native")
        diff = provenance.differences(a, b)
        res["paired_differences"] = diff
        res["fingerprints"] = {"strict": a["fingerprint"], "native": b["fingerprint"],
                               "without_route": [provenance.fingerprint(a, ["route"]),
                                                 provenance.fingerprint(b, ["route"])]}
        res["image"] = a["image"]
        res["toolchain"] = a["toolchain"]
        if diff != ["route"]:
            res["problems"].append(f"paired arms differ beyond the route: {diff}")
        if not a["image"]["tag"] or not a["image"]["digest"]:
            res["problems"].append("image tag/digest missing from the capability record")
        if a.get("errors"):
            res["problems"].append(f"capability record errors: {a['errors']}")
    res["passed"] = not res["problems"]
    text = json.dumps(res, indent=1, sort_keys=True)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "smoke.json"), "w") as f:
            f.write(text + "\n")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
