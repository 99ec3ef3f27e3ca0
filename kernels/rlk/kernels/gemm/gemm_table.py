"""The checked-in sm_90 GEMM table from a tuner output: ``gemm_tune --install`` (a whole run
replaces the table; a partial one is merged into it, naming both measurement records).
"""

from __future__ import annotations

import json
import os
import shutil


def merge_buckets(tuned: list, base: list, max_m: int) -> list:
    """``tuned`` buckets up to M = ``max_m`` (its open bucket closed there), then the ``base``
    buckets that reach above ``max_m``: the table a partial tune leaves, measured where it ran
    and unchanged elsewhere (all of ``base`` when nothing was tuned)."""
    if not tuned:
        return [list(b) for b in base]
    out = []
    for b in tuned:
        hi = max_m if b[0] is None else min(b[0], max_m)
        out.append([hi, b[1], b[2]])
        if hi == max_m:
            break
    out += [list(b) for b in base if b[0] is None or b[0] > max_m]
    return out


def install(tuned: str, table_out: str, record_out: str, m_list_all, shapes: dict) -> None:
    """Split a tuner output into the checked-in table (everything but the measurements, plus
    the record's file name) and the measurement record (the tuner's file, unchanged).
    ``m_list_all``: the tuner's whole M list (for an output that records none); ``shapes``: the
    tuner's shapes, all of which, with its default rule, make a run whole.

    A partial run (``--max-m`` below the largest M, ``--shapes``, or a budget that skipped shapes)
    is merged into the table at ``table_out``: its shapes take the tuned buckets up to its largest
    M and keep the table's above; shapes it did not tune, and the default rule, stay as they are.
    The table then names both records (``tuning_record`` the new one, ``tuning_base`` what it kept)."""
    from rlk.kernels.gemm import contract  # noqa: PLC0415

    with open(tuned) as f:
        doc = json.load(f)
    if "shapes" not in doc or "tuning" not in doc:
        raise SystemExit(f"{tuned}: not a gemm_tune output (no 'shapes' / 'tuning')")
    tuned_for = doc["tuning"].get("contract", contract.CONTRACT_ID)
    if tuned_for != contract.CONTRACT_ID:
        raise SystemExit(f"{tuned}: tuned for {tuned_for}; the checked-in table serves {contract.CONTRACT_ID} "
                         "(its split_k entries restate that contract's rule)")
    m_list = doc["tuning"].get("m_list") or list(m_list_all)
    # The default rule is fitted only by a run over every M (see main), so "rule" marks one.
    whole = "rule" in doc["tuning"] and {f"{K}x{N}" for K, N in shapes.values()} <= set(doc["shapes"])
    if whole:
        table = {k: v for k, v in doc.items() if k != "tuning"}
        what = f"{len(table['shapes'])} shapes"
    else:
        with open(table_out) as f:
            table = json.load(f)
        kept, node = [], table
        while node:
            kept.append(node.get("tuning_record") or node.get("record"))
            node = node.get("tuning_base") or node.get("base")
        if os.path.basename(record_out) in kept:
            raise SystemExit(f"--record {record_out}: the merged table keeps buckets measured in "
                             f"{os.path.basename(record_out)}; give the new record another name")
        max_m = max(m_list)
        for key, entry in doc["shapes"].items():
            base = table["shapes"].get(key, {})
            base_bks = base.get("buckets") or table.get("default_buckets") or [[None, "prefill", None]]
            table["shapes"][key] = {**base, "split_k": entry["split_k"],
                                    "buckets": merge_buckets(entry["buckets"], base_bks, max_m)}
        table["tuning_base"] = {"record": table.get("tuning_record"), "status": table.get("status"),
                                **({"base": table["tuning_base"]} if "tuning_base" in table else {}),
                                "kept": f"buckets above M = {max_m}, shapes other than "
                                        f"{sorted(doc['shapes'])}, default_buckets"}
        table["status"] = f"M <= {max_m} of {sorted(doc['shapes'])}: {doc['status']}"
        what = f"{len(doc['shapes'])} shapes merged up to M = {max_m}"
    table["tuning_record"] = os.path.basename(record_out)
    with open(table_out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    shutil.copyfile(tuned, record_out)  # byte for byte: its sha256 is what provenance recorded
    print(f"wrote {table_out} ({what}) and {record_out}")
