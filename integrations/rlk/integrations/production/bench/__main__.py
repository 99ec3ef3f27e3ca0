"""Paired P/P vs R/R on the production stack (vLLM rollout + megatron-core trainer, one GPU).

    python -m rlk.integrations.production.bench pairs --dir CKPT --results R --n 5 [--seed 0] [--start 0] \\
        [--budget-s S] [ARM OPTIONS]
    python -m rlk.integrations.production.bench arm --arm pp|rr --dir CKPT --out R/pair<i>_<arm>.json [ARM OPTIONS]
    python -m rlk.integrations.production.bench report --results R [R2 ...] --out docs/results/e2e_production_h200.json
    python -m rlk.integrations.production.bench rollout ...   # one half of an arm (rollout_bench)
    python -m rlk.integrations.production.bench train ...     # the other half (train_bench)

ARM OPTIONS: ``--workload W1`` (engine_bench's workloads), ``--micro-tokens 16384`` (packed
tokens per trainer micro-batch; sequences are never split), ``--recompute full|selective|none``,
``--optimizer-step`` (megatron's Adam step as a phase; does not fit at full Qwen3-8B depth),
``--warmup 1`` (untimed trainer passes over every micro-batch), ``--profile`` (after the timed
runs, every phase once more under the profiler: device time per kernel category and host idle,
the report's attribution; never counted; ``pairs --profile --profile-pairs 1`` profiles pair 1
only).

Arms (each phase in a process of its own, so that each engine owns the GPU):

* ``pp``: stock vLLM rollout, then megatron-core's native trainer (local spec, torch varlen flash
  attention); old logp **recomputed** by a trainer forward.
* ``rr``: vLLM + rlk's plugin, then megatron-core on rlk's strict spec; old logp **reused** from
  the rollout, allowed only when the actor forward's logp equals the rollout's bitwise for every
  token; otherwise the arm fails closed (exit status 3, the mismatch count in the message).

``arm`` runs ``rollout`` (rollout_bench: engine start recorded, not counted; one untimed
generate of the workload, then the timed one) and ``train`` (train_bench: model load recorded,
not counted; phases ``old_logp`` (pp), ``ref_logp``, ``actor_fwd_bwd``, ``optimizer`` when
asked) as subprocesses and merges their records into ``--out`` (``records.merge``). Total =
rollout generate + the trainer phases that ran.

``pairs``: pair i runs both arms in a seeded random order (:func:`pair_order`, recorded in each
arm file); a pair whose two arm files exist is skipped, so the pairs of one results folder can
be spread over several calls (before it runs a new pair next to earlier ones it compares this
machine and tree with their trainers' capability records, ``records.PREFLIGHT_FIELDS``, and
exits with status 4 on a difference, which the report would refuse); ``--budget-s`` stops
before a pair that the longest pair so far says would not finish in time. ``report`` (report_bench): per-pair ratio RR / PP of totals, its
median over pairs and a bootstrap interval over pairs, p95 per arm, phases, memory, provenance,
targets; fewer than 5 pairs are reported as ``complete: false``.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

MODULE = "rlk.integrations.production.bench"
MIN_PAIRS = 5
_T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[bench {time.perf_counter() - _T0:7.1f}s] {msg}", flush=True)


def pair_order(seed: int, pair: int) -> tuple[str, str]:
    """The arm order of pair ``pair``: a seeded coin per pair (the same for the same seed)."""
    return ("pp", "rr") if random.Random(seed * 1_000_003 + pair).random() < 0.5 else ("rr", "pp")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def _trainer_options(a, profile: bool | None = None) -> list[str]:
    """The options ``arm`` hands to ``train`` (``pairs`` hands them, with the workload, to ``arm``);
    ``profile`` overrides ``a.profile`` (``pairs --profile-pairs``)."""
    out = ["--micro-tokens", str(a.micro_tokens), "--recompute", a.recompute, "--warmup", str(a.warmup)]
    if a.optimizer_step:
        out.append("--optimizer-step")
    if a.profile if profile is None else profile:
        out.append("--profile")
    if a.device:
        out += ["--device", a.device]
    return out


def _arm_options(a, profile: bool | None = None) -> list[str]:
    return ["--workload", a.workload] + _trainer_options(a, profile)


def profile_pairs(a) -> set[int] | None:
    """The pair numbers of ``--profile-pairs I,J`` (None: not given)."""
    if getattr(a, "profile_pairs", None) is None:
        return None
    try:
        out = {int(x) for x in a.profile_pairs.split(",") if x.strip()}
    except ValueError:
        out = set()
    if not out or min(out) < 0:
        raise SystemExit(f"--profile-pairs {a.profile_pairs!r}: pair numbers >= 0, comma-separated")
    return out


def profiled_pair(a, i: int) -> bool:
    """Whether pair ``i`` runs with ``--profile``: every pair, or with ``--profile-pairs I,J`` those
    pairs only (the profiled repeats come after the timed runs and add a minute or two per arm)."""
    chosen = profile_pairs(a)
    return bool(a.profile) and (chosen is None or i in chosen)


# ---- arm ----------------------------------------------------------------------------------------
def run_arm(a, run=subprocess.run) -> int:
    from rlk.integrations.production import records
    from rlk.integrations.production.train_bench import FAIL_CLOSED_RC

    stem = records.stem(a.out)
    r_json = a.rollout_json or stem + "_rollout.json"
    t_json = stem + "_train.json"
    if a.rollout_json is None:
        say(f"[{a.arm}] rollout -> {r_json}")
        p = run([sys.executable, "-m", MODULE, "rollout", "--arm", a.arm, "--dir", a.dir, "--out", r_json,
                 "--workload", a.workload] + (["--profile"] if a.profile else []), env=_env())
        if p.returncode != 0:
            print(f"arm {a.arm}: the rollout process failed (rc {p.returncode}); its output is above",
                  file=sys.stderr)
            return p.returncode or 1
    say(f"[{a.arm}] train -> {t_json}")
    cmd = [sys.executable, "-m", MODULE, "train", "--arm", a.arm, "--dir", a.dir, "--rollout", r_json, "--out", t_json]
    p = run(cmd + _trainer_options(a), env=_env())
    if p.returncode == FAIL_CLOSED_RC:
        print(f"arm {a.arm}: FAILED CLOSED (the trainer refused to reuse the rollout logp); record {t_json}",
              file=sys.stderr)
        return FAIL_CLOSED_RC
    if p.returncode != 0:
        print(f"arm {a.arm}: the trainer process failed (rc {p.returncode}); its output is above", file=sys.stderr)
        return p.returncode
    import json

    with open(r_json) as f:
        rollout = json.load(f)
    with open(t_json) as f:
        train = json.load(f)
    pair = {"index": a.pair, "order": a.order.split(",") if a.order else None} if a.pair is not None else None
    rec = records.merge(a.arm, rollout, train, pair)
    records.write_json(a.out, rec)
    say(f"[{a.arm}] total {rec['total_s']:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in rec["phases"].items()))
    return 0


# ---- pairs --------------------------------------------------------------------------------------
PROVENANCE_RC = 4  # pairs: this machine or tree differs from the pairs already in --results


def current_capability() -> dict:
    """{arm: capability record of its trainer} on this machine and tree (``pairs``' preflight),
    computed in a child process: the record reads the device, and this process must not hold a
    CUDA context while the arms' engines size their memory."""
    code = ("import json; from rlk.integrations.production import train_bench; "
            "print(json.dumps({a: train_bench.capability(a) for a in ('pp', 'rr')}, default=str))")
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"pairs: the capability record failed (rc {p.returncode}): {p.stderr.strip()[-2000:]}")
    import json

    return json.loads(p.stdout.strip().splitlines()[-1])


def run_pairs(a, run=subprocess.run) -> int:
    from rlk.integrations.production import records

    os.makedirs(a.results, exist_ok=True)
    done = set(records.complete_pairs(a.results))
    if done and any(i not in done for i in range(a.start, a.start + a.n)):
        # The report refuses pairs of one arm whose capability fingerprints differ: find out now,
        # not after a pair's minutes of device time.
        conflicts = records.provenance_conflicts(a.results, current_capability)
        if conflicts:
            print(f"pairs: this machine or tree differs from the pairs already in {a.results} "
                  f"({len(conflicts)} fields: {'; '.join(conflicts[:8])}); the report would refuse them "
                  "together: run the same tree, or another --results folder", file=sys.stderr)
            return PROVENANCE_RC
        say(f"preflight: none of the {len(records.PREFLIGHT_FIELDS)} capability fields differs from the "
            f"trainer records of the pairs in {a.results}")
    longest = 0.0
    for i in range(a.start, a.start + a.n):
        paths = {arm: records.arm_path(a.results, i, arm) for arm in records.ARMS}
        if i in done:
            say(f"pair {i}: both arm files exist, skipped")
            continue
        elapsed = time.perf_counter() - _T0
        if a.budget_s and longest and elapsed + longest > a.budget_s:
            say(f"pair {i}: not started ({elapsed:.0f} s used, the longest pair took {longest:.0f} s, "
                f"budget {a.budget_s:.0f} s); rerun with the same --results to continue")
            return 0
        order = pair_order(a.seed, i)
        t_pair = time.perf_counter()
        for pos, arm in enumerate(order):
            say(f"pair {i} arm {pos + 1}/2: {arm} (order {','.join(order)}, seed {a.seed})")
            t_arm = time.perf_counter()
            cmd = [sys.executable, "-m", MODULE, "arm", "--arm", arm, "--dir", a.dir, "--out", paths[arm],
                   "--pair", str(i), "--order", ",".join(order)] + _arm_options(a, profiled_pair(a, i))
            p = run(cmd, env=_env())
            say(f"pair {i} arm {arm}: rc {p.returncode} in {time.perf_counter() - t_arm:.0f} s")
            if p.returncode != 0:
                print(f"pairs: pair {i} arm {arm} failed (rc {p.returncode}); stopping", file=sys.stderr)
                return p.returncode
        longest = max(longest, time.perf_counter() - t_pair)
    say("pairs done")
    return 0


# ---- command line -------------------------------------------------------------------------------
def _add_arm_options(p) -> None:
    p.add_argument("--workload", default="W1")
    p.add_argument("--micro-tokens", type=int, default=16384)
    p.add_argument("--recompute", default="full", choices=["full", "selective", "none"])
    p.add_argument("--optimizer-step", action="store_true")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--profile", action="store_true",
                   help="attribution: each phase once more under the profiler after the timed runs (not counted)")
    p.add_argument("--device", default=None, help=argparse.SUPPRESS)  # the trainer's (tests: cpu)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rollout")
    r.add_argument("--arm", required=True, choices=["pp", "rr"])
    r.add_argument("--dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--workload", default="W1")
    r.add_argument("--profile", action="store_true")
    t = sub.add_parser("train")
    t.add_argument("--arm", required=True, choices=["pp", "rr"])
    t.add_argument("--dir", required=True)
    t.add_argument("--rollout", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--micro-tokens", type=int, default=16384)
    t.add_argument("--recompute", default="full", choices=["full", "selective", "none"])
    t.add_argument("--optimizer-step", action="store_true")
    t.add_argument("--warmup", type=int, default=1)
    t.add_argument("--seed", type=int, default=0, help="the advantages' seed")
    t.add_argument("--device", default=None)
    t.add_argument("--profile", action="store_true")
    m = sub.add_parser("arm")
    m.add_argument("--arm", required=True, choices=["pp", "rr"])
    m.add_argument("--dir", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--rollout-json", default=None,
                   help="an existing rollout record: run only the trainer half on its tokens")
    m.add_argument("--pair", type=int, default=None, help=argparse.SUPPRESS)
    m.add_argument("--order", default=None, help=argparse.SUPPRESS)
    _add_arm_options(m)
    p = sub.add_parser("pairs")
    p.add_argument("--dir", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--n", type=int, default=MIN_PAIRS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=0.0, help="stop before a pair that would pass this")
    p.add_argument("--profile-pairs", default=None, metavar="I,J",
                   help="with --profile: profile only these pair numbers (default: every pair)")
    _add_arm_options(p)
    rp = sub.add_parser("report")
    rp.add_argument("--results", required=True, nargs="+")
    rp.add_argument("--out", required=True)
    return ap


def validate(a) -> None:
    """Refuses bad values with the option's name, before any engine is imported."""
    from rlk.integrations.vllm.engine_bench import WORKLOADS

    if getattr(a, "workload", None) is not None and a.workload not in WORKLOADS:
        raise SystemExit(f"--workload {a.workload!r}: one of {sorted(WORKLOADS)}")
    if getattr(a, "micro_tokens", 1) < 1:
        raise SystemExit(f"--micro-tokens must be >= 1 (got {a.micro_tokens})")
    if getattr(a, "warmup", 0) < 0:
        raise SystemExit(f"--warmup must be >= 0 (got {a.warmup})")
    if a.cmd == "pairs" and (a.n < 1 or a.start < 0 or a.budget_s < 0):
        raise SystemExit(f"--n must be >= 1, --start and --budget-s >= 0 (got {a.n}, {a.start}, {a.budget_s})")
    if a.cmd == "pairs" and a.profile_pairs is not None:
        if not a.profile:
            raise SystemExit(f"--profile-pairs {a.profile_pairs}: needs --profile")
        profile_pairs(a)
    if a.cmd in ("arm", "pairs", "rollout", "train") and not os.path.isfile(os.path.join(a.dir, "config.json")):
        raise SystemExit(f"--dir {a.dir!r} holds no config.json (a checkpoint from "
                         "`python -m rlk.integrations.vllm.engine_bench prepare`)")
    if a.cmd == "arm" and a.order is not None and sorted(a.order.split(",")) != ["pp", "rr"]:
        raise SystemExit(f"--order {a.order!r}: pp,rr or rr,pp")
    if a.cmd == "train" and not os.path.isfile(a.rollout):
        raise SystemExit(f"--rollout {a.rollout!r} does not exist")


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    validate(a)
    if a.cmd == "rollout":
        from rlk.integrations.production.rollout_bench import run_rollout

        run_rollout(a.arm, a.dir, a.out, a.workload, profile=a.profile)
        return 0
    if a.cmd == "train":
        from rlk.integrations.production import train_bench

        try:
            train_bench.run_train(a.arm, a.dir, a.rollout, a.out, micro_tokens=a.micro_tokens,
                                  recompute=None if a.recompute == "none" else a.recompute,
                                  optimizer_step=a.optimizer_step, warmup=a.warmup, seed=a.seed, device=a.device,
                                  profile=a.profile)
        except train_bench.FailClosed as e:
            print(str(e), file=sys.stderr)
            return train_bench.FAIL_CLOSED_RC
        return 0
    if a.cmd == "arm":
        return run_arm(a)
    if a.cmd == "pairs":
        return run_pairs(a)
    from rlk.integrations.production import report_bench

    rep = report_bench.write(a.results, a.out)
    say(f"report {a.out}: {rep['pairs']} pairs, ratio {rep.get('ratio')} CI {rep.get('ratio_ci95')}, "
        f"targets {rep['targets']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
