"""Ladder L0 checks (static; every profile): contracts, cross-target compilation, golden fingerprints.

* ``L0:contracts.registered``: every contract module imports, every contract is well formed
  (``Contract.problems()``), its bit hashes match ``python/rlk/contracts.lock.json``
  (``rlk.contracts.check_lock``: a bit field changed under an unchanged ID fails), and contracts
  and kernels name each other consistently.
* ``L0:crosstarget.compile``: every registered kernel and config compiled for sm_90 and gfx942 on
  CPU, contract fields verified in the assembly (``rlk.gate.crosstarget``); writes
  ``crosstarget.json`` into the gate's output folder.
* ``L0:crosstarget.golden``: the fingerprints equal ``crosstarget_golden.json``.

CLI: ``python -m rlk.gate.l0_checks --update-lock`` rewrites the lock after a deliberate,
versioned contract change; ``python -m rlk.gate.l0_checks`` runs the three checks and prints them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rlk.gate import crosstarget
from rlk.gate.registry import PROFILES, CheckResult, GateContext, register_check

_ALL = PROFILES


def lock_path() -> Path:
    import rlk.contracts

    return Path(rlk.contracts.__file__).with_name("contracts.lock.json")


def contract_problems() -> tuple[list[str], dict]:
    """Problems with the registered contracts and kernels (imports every contract module)."""
    from rlk import contracts
    from rlk.kernels import registry

    cs = contracts.load_all()  # import errors propagate: the check fails with their text
    out = [f"{c.id}: {p}" for c in cs for p in c.problems()]
    if not cs:
        out.append("no contracts registered")
    lp = lock_path()
    if lp.exists():
        out += [f"lock: {p}" for p in contracts.check_lock(json.loads(lp.read_text()), cs)]
    else:
        out.append(f"no lock file {lp.name} (python -m rlk.gate.l0_checks --update-lock)")
    kernels = registry.all_kernels()
    ids = {c.id for c in cs}
    names = {k.name for k in kernels}
    for k in kernels:
        if k.contract_id not in ids:
            out.append(f"kernel {k.name}: contract {k.contract_id!r} not registered")
        if not k.configs:
            out.append(f"kernel {k.name}: no configs registered")
    for c in cs:
        for n in c.kernels:
            if n not in names:
                out.append(f"{c.id}: names kernel {n!r}, which is not registered")
    return out, {"contracts": len(cs), "kernels": len(kernels)}


_RESULT: dict | None = None


def _compiled(progress=print) -> dict:
    global _RESULT
    if _RESULT is None:
        progress("L0: compiling every registered kernel for sm_90 and gfx942 (CPU, no GPU)")
        _RESULT = crosstarget.compile_all()
    return _RESULT


def _summary(probs: list[str], n: int = 8) -> str:
    more = f" (+{len(probs) - n} more)" if len(probs) > n else ""
    return "; ".join(probs[:n]) + more


@register_check("L0", "contracts.registered", profiles=_ALL)
def check_contracts(ctx: GateContext) -> CheckResult:
    probs, metrics = contract_problems()
    metrics["problems"] = len(probs)
    if probs:
        return CheckResult(False, _summary(probs), metrics)
    return CheckResult(True, f"{metrics['contracts']} contracts well formed and locked; "
                             f"{metrics['kernels']} kernels registered", metrics)


@register_check("L0", "crosstarget.compile", profiles=_ALL)
def check_crosstarget(ctx: GateContext) -> CheckResult:
    res = _compiled(ctx.progress)
    recs = res["records"]
    probs = crosstarget.problems(res)
    if ctx.out_dir:
        os.makedirs(ctx.out_dir, exist_ok=True)
        Path(ctx.out_dir, "crosstarget.json").write_text(json.dumps(crosstarget.report(res), indent=1) + "\n")
    kernels = sorted({r["kernel"] for r in recs})
    metrics = {
        "triton_version": res["triton_version"], "kernels": kernels, "records": len(recs),
        "compiled": {t: sum(r["compiled"] and r["target"] == t for r in recs) for t in crosstarget.TARGETS},
        "fusion_relevant": sum(bool(r["fusion_relevant"]) for r in recs), "problems": len(probs),
    }
    if not recs:
        probs = probs + ["no strict kernels registered: nothing was compiled"]
    if probs:
        return CheckResult(False, _summary(probs), metrics)
    return CheckResult(True, f"{len(kernels)} kernels, {len(recs)} (kernel, config, target) compiles for "
                             f"sm_90 and gfx942: MMA forms, fp fusion, no float atomics verified: "
                             + ", ".join(kernels), metrics)


@register_check("L0", "crosstarget.golden", profiles=_ALL)
def check_golden(ctx: GateContext) -> CheckResult:
    res = _compiled(ctx.progress)
    diffs = crosstarget.compare_golden(res, crosstarget.load_golden())
    n = sum(r["compiled"] for r in res["records"])
    metrics = {"fingerprints": n, "differences": len(diffs), "triton_version": res["triton_version"]}
    if not n:
        diffs = diffs + ["no compiled kernels: no fingerprint compared"]
    if diffs:
        return CheckResult(False, _summary(diffs), metrics)
    return CheckResult(True, f"{n} fingerprints equal the golden file (triton {res['triton_version']})", metrics)


def source_root() -> str | None:
    """The repository checkout this rlk runs from (``bazel run`` names it), or None."""
    env = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    if env and os.path.exists(os.path.join(env, "MODULE.bazel")):
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(6):
        if os.path.exists(os.path.join(here, "MODULE.bazel")) and os.path.exists(os.path.join(here, "ci", "check_build.py")):
            return here
        here = os.path.dirname(here)
    return None


@register_check("L0", "build.consistent", profiles=_ALL)
def check_build_files(ctx: GateContext) -> CheckResult:
    """ci/check_build.py over the checkout: WORKSPACE/MODULE/stand-ins agree, every source file is
    covered by a target, imports follow ARCHITECTURE.md's layer order, buildifier clean. Without a checkout there is nothing to check: FAIL."""
    import subprocess

    root = source_root()
    if root is None:
        return CheckResult(False, "no source checkout found (MODULE.bazel + ci/check_build.py); build files not checked")
    args = [sys.executable, os.path.join(root, "ci", "check_build.py"), "--root", root]
    if os.environ.get("RLK_GATE_NO_BUILDIFIER"):
        args.append("--no-buildifier")
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    return CheckResult(p.returncode == 0, lines[-1] if lines else (p.stderr.strip()[-300:] or "no output"),
                       {"problems": [ln for ln in lines if ln.startswith("check_build: ") and "OK" not in ln][:20]})


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rlk.gate.l0_checks", description=__doc__.split("\n")[0])
    ap.add_argument("--update-lock", action="store_true", help="rewrite python/rlk/contracts.lock.json")
    a = ap.parse_args(argv)
    if a.update_lock:
        from rlk import contracts

        cs = contracts.load_all()
        bad = [f"{c.id}: {p}" for c in cs for p in c.problems()]
        if bad:
            print("not writing the lock; malformed contracts:\n  " + "\n  ".join(bad))
            return 1
        lock_path().write_text(json.dumps(contracts.lock_json(cs), indent=1, sort_keys=True) + "\n")
        print(f"wrote {lock_path()} ({len(cs)} contracts)")
        return 0
    ctx = GateContext(profile="cpu", out_dir="")
    ok = True
    for fn in (check_contracts, check_crosstarget, check_golden, check_build_files):
        try:
            r = fn(ctx)
        except Exception as e:  # noqa: BLE001 - a check that raises fails
            r = CheckResult(False, f"{type(e).__name__}: {e}")
        ok &= r.passed
        print(f"{'PASS' if r.passed else 'FAIL'} {fn.__name__}: {r.detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
