"""Where the host time of one e2e phase goes: cProfile of the phase on the L5 workload.

    python -m rlk.bench.host_profile_probe --out DIR [--phase rollout] [--routes native strict] [--reps 2] [--no-step-logp]

For each route: build the L5-size workload (``rlk.bench.checks.L5_ARGS``), run one warm-up step
of the phase, then profile ``--reps`` runs of it under cProfile. Writes ``DIR/host_<route>_<phase>.txt``
(pstats text, sorted by own time and by cumulative time; no pickled stats) and prints the top
entries. A diagnostic for the host-bound phases (the rollout is host-bound in both arms on the
H200 machine, docs/results/gate_h200_2026-12-01/README.md); not a benchmark: cProfile slows
Python, so only the shares inside one profile mean something.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats


def profile_route(route: str, phase: str, reps: int, top: int = 40, device: str = "cuda", **overrides) -> str:
    import torch

    from rlk.bench.checks import l5_spec
    from rlk.bench.workload import Workload

    wl = Workload(l5_spec(device, **overrides), route)
    fn = wl.phase(phase)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    with torch.no_grad() if phase != "actor_fwd_bwd" else contextlib.nullcontext():
        fn()  # warm-up: compilation, graph capture, allocator growth
        sync()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            fn()
        sync()
        prof.disable()
    text = []
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
        text.append(f"==== {route} {phase}: {reps} run(s), sorted by {key}\n{buf.getvalue()}")
    return "\n".join(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--phase", default="rollout", choices=("rollout", "old_logp", "ref_logp", "actor_fwd_bwd"))
    ap.add_argument("--routes", nargs="+", default=["native", "strict"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--step-logp", action=argparse.BooleanOptionalAction, default=True,
                    help="RolloutConfig.step_logp (forced-token logp in the graphs; default on)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    for route in a.routes:
        text = profile_route(route, a.phase, a.reps, a.top, step_logp=a.step_logp)
        path = os.path.join(a.out, f"host_{route}_{a.phase}.txt")
        with open(path, "w") as f:
            f.write(text)
        print(text[:6000], flush=True)
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
