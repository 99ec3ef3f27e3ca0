"""Runs a scenario on N local processes over gloo (CPU tests, L3 gate checks) or NCCL (GPUs).

Parent side: :func:`run_world` starts ``python -m rlk.collectives.harness`` once per rank
(subprocesses, no pickling: parameters go in as JSON, results come back as JSON files), waits
with a hard deadline and returns one dict per rank. Child side: sets up the environment
(``OMP_NUM_THREADS=1``, the Triton CPU interpreter when there is no GPU), joins a gloo group
through a TCP store on 127.0.0.1 with a short timeout, runs ``module:function(rank, world,
params)`` and writes ``{"ok": ..., "result"|"error_type"/"error": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

_ROOTS = ("python", "kernels", "collectives", "integrations")


def _repo_root() -> str:
    here = os.path.dirname(os.path.abspath(__file__))  # collectives/rlk/collectives
    return os.path.dirname(os.path.dirname(os.path.dirname(here)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(scenario: str, world_size: int, params: dict | None = None, *, pg_timeout_s: float = 10.0,
              deadline_s: float = 60.0, backend: str = "gloo") -> list[dict]:
    """Runs ``scenario`` (``"pkg.module:function"``) on ``world_size`` processes; one dict per rank.

    A rank whose process does not finish within ``deadline_s`` is killed and reported as
    ``{"ok": False, "error_type": "ProcessTimeout"}``; a crash as ``"ProcessCrash"``.
    """
    root = _repo_root()
    env = dict(os.environ)
    paths = [os.path.join(root, r) for r in _ROOTS]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["OMP_NUM_THREADS"] = "1"
    env["MASTER_ADDR"] = "127.0.0.1"
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rlk_coll_") as out:
        procs = []
        for r in range(world_size):
            cmd = [sys.executable, "-m", "rlk.collectives.harness", "--scenario", scenario, "--rank", str(r),
                   "--world", str(world_size), "--port", str(port), "--out", out,
                   "--pg-timeout", str(pg_timeout_s), "--backend", backend, "--params", json.dumps(params or {})]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        end = time.monotonic() + deadline_s
        logs, results = [], []
        for p in procs:
            try:
                so, _ = p.communicate(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()  # only processes this function started, by their handle
                so, _ = p.communicate()
            logs.append(so.decode(errors="replace")[-4000:])
        for r, p in enumerate(procs):
            path = os.path.join(out, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
            elif p.returncode is not None and p.returncode < 0:
                results.append({"ok": False, "rank": r, "error_type": "ProcessTimeout",
                                "error": f"killed after {deadline_s} s", "log": logs[r]})
            else:
                results.append({"ok": False, "rank": r, "error_type": "ProcessCrash",
                                "error": f"exit code {p.returncode}", "log": logs[r]})
        return results


def _child() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pg-timeout", type=float, default=10.0)
    ap.add_argument("--params", default="{}")
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    a = ap.parse_args()

    import torch

    from rlk import determinism

    if not torch.cuda.is_available():
        determinism.configure_cpu_interpreter()
    torch.set_num_threads(1)
    import datetime
    import importlib

    import torch.distributed as dist

    t0 = time.monotonic()
    rec: dict = {"rank": a.rank, "world": a.world}
    try:
        store = dist.TCPStore("127.0.0.1", a.port, a.world, a.rank == 0,
                              timeout=datetime.timedelta(seconds=max(30.0, a.pg_timeout)))
        if a.backend == "nccl":  # one GPU per rank
            torch.cuda.set_device(a.rank % torch.cuda.device_count())
        dist.init_process_group(a.backend, store=store, rank=a.rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=a.pg_timeout))
        mod, fn = a.scenario.split(":")
        result = getattr(importlib.import_module(mod), fn)(a.rank, a.world, json.loads(a.params))
        rec.update(ok=True, result=result)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        rec.update(ok=False, error_type=type(e).__name__, error=str(e), traceback=traceback.format_exc()[-3000:])
    rec["elapsed_s"] = time.monotonic() - t0
    tmp = os.path.join(a.out, f".rank{a.rank}.json")
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, os.path.join(a.out, f"rank{a.rank}.json"))
    sys.stdout.flush()
    # Skip interpreter teardown: a peer may be gone, and gloo's destructors can block on it.
    os._exit(0)


if __name__ == "__main__":
    _child()
