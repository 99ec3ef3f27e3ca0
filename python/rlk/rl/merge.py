"""One RL-loop report of arms that ran in separate processes (``python -m rlk.rl --merge``)."""

from __future__ import annotations

import json
import os

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.routes import ROUTES
from rlk.rl import report as rep
from rlk.rl.loop import LoopConfig, output_paths, strict_failures

# Config keys that may differ between merged reports' arms (the route is what tells them apart).
_MERGE_FREE_CONFIG = {"route"}
# Model keys that may differ (setup time is a measurement, not a setting).
_MERGE_FREE_MODEL = {"setup_seconds"}


def merge_reports(json_paths: list[str], out_dir: str, tag: str | None = None) -> dict:
    """One report of arms that ran in separate processes (e.g. the strict and the native arm of
    a GPU loop, one device call each: both do not fit one call's time limit).

    Refuses (:class:`UnsupportedConfigError`): a route that appears twice or is unknown, arms whose
    configs differ in anything but the route, models that differ, sources without a device or
    toolchain record or measured on another one, and an output file that is one of the sources. The
    merged report keeps every source's provenance (``provenance.merged_from``, each with its file
    name and routes), recomputes ``passed`` / ``failures`` from the strict arm as
    :func:`rlk.rl.loop.run_and_report` does, and is written as ``rl_loop_<tag>.json`` + ``.png``
    (the step lines stay in each source's ``steps.jsonl``)."""
    if len(json_paths) < 2:
        raise UnsupportedConfigError(f"merge: give at least two reports (got {len(json_paths)})")
    arms: dict[str, dict] = {}
    sources = []
    for path in json_paths:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or not isinstance(doc.get("arms"), dict) or not doc["arms"]:
            raise UnsupportedConfigError(f"merge: {path} holds no arms (not an rl_loop report)")
        for route, arm in doc["arms"].items():
            if route not in ROUTES:
                raise UnsupportedConfigError(f"merge: {path} has an arm of unknown route {route!r} (known: {ROUTES})")
            if route in arms:
                raise UnsupportedConfigError(f"merge: route {route!r} appears in more than one report ({path})")
            if not isinstance(arm, dict) or not isinstance(arm.get("config"), dict) or "steps" not in arm:
                raise UnsupportedConfigError(f"merge: {path}: arm {route!r} has no config or steps")
            arms[route] = arm
        prov = doc.get("provenance") or {}
        if not isinstance(prov, dict) or not prov.get("device") or not prov.get("toolchain"):
            raise UnsupportedConfigError(f"merge: {path} records no device or toolchain in its provenance")
        sources.append({"file": os.path.basename(path), "routes": sorted(doc["arms"]), "provenance": prov})
    first_route, first = next(iter(arms.items()))
    for route, arm in arms.items():
        for key, free in (("config", _MERGE_FREE_CONFIG), ("model", _MERGE_FREE_MODEL)):
            a, b = first.get(key) or {}, arm.get(key) or {}
            diff = sorted(k for k in set(a) | set(b) if k not in free and a.get(k) != b.get(k))
            if diff:
                raise UnsupportedConfigError(f"merge: arms {first_route!r} and {route!r} differ in {key} {diff}")
    base = sources[0]["provenance"]
    for src in sources[1:]:
        for key in ("device", "toolchain"):
            a, b = base[key], src["provenance"][key]
            if a != b:
                diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)) if isinstance(a, dict) \
                    and isinstance(b, dict) else [key]
                raise UnsupportedConfigError(f"merge: {src['file']} was measured on another {key} than "
                                             f"{sources[0]['file']} ({', '.join(map(str, diff))} differ)")
    routes = [r for r in ROUTES if r in arms]
    arms = {r: arms[r] for r in routes}
    failures = strict_failures(arms["strict"]) if "strict" in arms else []
    lc = LoopConfig.from_dict(first["config"])
    paths = output_paths(out_dir, lc.device, tag)
    clash = [p for p in json_paths if os.path.abspath(p) in {os.path.abspath(paths["json"]), os.path.abspath(paths["png"])}]
    if clash:
        raise UnsupportedConfigError(f"merge: the merged report would overwrite its source {clash[0]} "
                                     "(another --out or --tag)")
    os.makedirs(out_dir, exist_ok=True)
    report = {"arms": arms, "routes": routes, "passed": not failures, "failures": failures,
              "provenance": {"merged_from": sources, "note": "arms from separate processes; each source's "
                             "provenance as it recorded it"}}
    png = rep.plot(arms, paths["png"], title=rep.title_of(lc, arms), reward_rule=lc.task().reward_rule())
    report["files"] = {"json": paths["json"], "png": png or "not written: matplotlib is not importable"}
    rep.write_json(report, paths["json"])
    return report
