"""Ladder L3 checks (profile ``cpu``): short gloo runs at world sizes 2 and 4, bitwise.

Each check spawns fresh processes through ``rlk.collectives.harness``; every rank compares its
outputs with the single-process reference (collectives), with TP=1 (layers) or with CP=1
(attention rows), and the check compares output hashes across ranks. About 30-60 s in all on a
2-core CPU machine (process start-up dominates).
"""

from __future__ import annotations

import time

from rlk.gate.registry import CheckResult, register_check

SC = "rlk.collectives."


def _run(scenario, world, params, deadline_s=120.0):
    from rlk.collectives.harness import run_world

    t0 = time.monotonic()
    rs = run_world(SC + scenario, world, params, deadline_s=deadline_s)
    bad = [r for r in rs if not r["ok"]]
    if bad:
        b = bad[0]
        return None, f"rank {b['rank']}: {b.get('error_type')}: {str(b.get('error'))[:400]}", time.monotonic() - t0
    res = [r["result"] for r in rs]
    return res, "", time.monotonic() - t0


def _same_rows(res, keys=("ar", "ag")):
    return all(a[k] == b[k] for r in res[1:] for a, b in zip(res[0]["rows"], r["rows"]) for k in keys)


@register_check("L3", "collectives.gloo_ws2", profiles=("cpu",))
def collectives_ws2(ctx) -> CheckResult:
    res, err, dt = _run("scenarios:collectives_bitwise", 2, {"sizes": [1, 3, 4099, 65537], "with_out_dtype": True,
                                                              "merge": True})
    if res is None:
        return CheckResult(False, err)
    ok = _same_rows(res)
    n = len(res[0]["rows"])
    return CheckResult(ok, f"ar/rs/ag bf16+fp32, {n} sizes, bitwise vs reference on each rank, "
                       f"{'identical' if ok else 'DIFFERENT'} across 2 ranks ({dt:.1f} s)",
                       {"cases": n, "world_size": 2, "seconds": dt})


@register_check("L3", "collectives.gloo_ws4", profiles=("cpu",))
def collectives_ws4(ctx) -> CheckResult:
    cases = [["bf16", 1], ["bf16", 4099], ["fp32", 7], ["fp32", 65537]]
    res, err, dt = _run("scenarios:collectives_bitwise", 4, {"cases": cases, "merge": True})
    if res is None:
        return CheckResult(False, err)
    ok = _same_rows(res) and res[0]["order_sensitive_cases"] >= 2
    return CheckResult(ok, f"ar/rs/ag + logsumexp-stats merge, world 4, bitwise vs reference, identical across "
                       f"ranks; order-sensitive inputs: {res[0]['order_sensitive_cases']} ({dt:.1f} s)",
                       {"cases": len(cases), "world_size": 4, "seconds": dt})


@register_check("L3", "tp_cp.gloo_ws2", profiles=("cpu",))
def tp_cp_ws2(ctx) -> CheckResult:
    res, err, dt = _run("tp_scenarios:tp_cp", 2, {"K": 512})
    if res is None:
        return CheckResult(False, err)
    if any(r != res[0] for r in res[1:]) or not res[0]["tp"]["row_equals_tp1"]:
        return CheckResult(False, f"TP=2 results differ across ranks or from TP=1: {res}")
    return CheckResult(True, f"TP=2 column/row/embedding equal TP=1 (row at K=512,N=64 where promised); "
                       f"CP=2 attention out+lse rows equal CP=1 ({dt:.1f} s)", {"world_size": 2, "seconds": dt})
