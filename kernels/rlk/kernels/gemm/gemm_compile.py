"""The GEMM tuner's parallel compile: every (shape, candidate) kernel launched once in worker
processes, which fill Triton's on-disk cache so that the timing process loads instead of compiling.

A compiler that aborts its process (an LLVM ``UNREACHABLE``, not a Python exception) takes down
only the job it was compiling: each worker announces a job on its pipe before it starts it. A job
that runs past ``JOB_TIMEOUT_S`` (a compile or a first launch that hangs: a kernel that never
returns holds its process forever) has its process killed and is reported the same way.
Used by :mod:`rlk.kernels.gemm.gemm_tune` (and the GPU candidate test).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import torch

JOB_TIMEOUT_S = 180.0  # one kernel's compile and first launch; Triton compiles one in seconds


def _dev() -> str:
    """CUDA; the CPU only under the Triton interpreter (the tuner's own smoke test)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _key(cand) -> str:
    """A (schedule, fields) candidate's name in the tuner's records."""
    sched, cfg = cand
    return sched + ":" + ",".join(f"{k}={cfg[k]}" for k in sorted(cfg))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


_WEIGHTS = {}  # (K, N) -> a zero weight (one per worker process)


def _compile_one(job) -> str | None:
    """Launch (K, N, schedule, cfg, contract, fp32 output) once at M = 1 (fills Triton's disk
    cache); the error text, or None."""
    from rlk.kernels.gemm import launch  # noqa: PLC0415

    K, N, sched, cfg, cid, fp32 = job
    try:
        if (K, N) not in _WEIGHTS:
            _WEIGHTS.clear()
            _WEIGHTS[(K, N)] = torch.zeros(N, K, device=_dev(), dtype=torch.bfloat16)
        x = torch.zeros(1, K, device=_dev(), dtype=torch.bfloat16)
        launch.gemm(x, _WEIGHTS[(K, N)], schedule=sched, config=cfg, contract=cid,
                    out_dtype=torch.float32 if fp32 else torch.bfloat16)
        _sync()
        return None
    except Exception as e:  # noqa: BLE001 (a config that does not compile is reported, not fatal)
        return f"{type(e).__name__}: {str(e)[:120]}"


def _compile_worker(conn, jobs: list, compile_one=_compile_one) -> None:
    """Worker: compile ``jobs`` [(index, job)] in order, saying on ``conn`` which one starts
    before it starts (``conn.send`` writes at once), so that a compiler that aborts the process
    (an LLVM ``UNREACHABLE``, not a Python exception) is pinned on its job."""
    for idx, job in jobs:
        conn.send(("start", idx))
        conn.send(("done", idx, compile_one(job)))
    conn.close()


def _compile_parallel(jobs: list, workers: int, compile_one=_compile_one,
                      job_timeout_s: float = JOB_TIMEOUT_S) -> dict:
    """{index: error text or None} of ``jobs`` compiled by ``compile_one`` (a module-level
    function) in ``workers`` processes. A process that dies takes down only the job it was
    compiling (reported with its exit code); the rest of its share goes on in a new process. A
    job still running after ``job_timeout_s`` seconds has its process killed (reported as such)."""
    from multiprocessing.connection import wait  # noqa: PLC0415

    ctx = mp.get_context("spawn")
    out = {}
    # connection -> [process, remaining [(index, job)], index being compiled, messages received,
    #                time the current job started, the index its process was killed on (or None)]
    running = {}

    def start(share):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_compile_worker, args=(child, share, compile_one), daemon=True)
        p.start()
        child.close()
        running[parent] = [p, list(share), None, 0, time.monotonic(), None]

    indexed = list(enumerate(jobs))
    for i in range(workers):
        if indexed[i::workers]:
            start(indexed[i::workers])
    while running:
        now = time.monotonic()
        for conn, state in running.items():
            # Only with nothing left unread on its pipe: a "done" already sent must not be lost,
            # nor the next job (announced after it) blamed for the one that ran long.
            if (state[2] is not None and state[5] is None and now - state[4] > job_timeout_s
                    and not conn.poll()):
                state[5] = state[2]
                state[0].kill()  # its pipe then reads EOF below
        for conn in wait(list(running), timeout=min(5.0, job_timeout_s)):
            state = running[conn]
            try:
                msg = conn.recv()
            except EOFError:  # the worker finished or died
                del running[conn]
                state[0].join(timeout=30)
                if state[0].is_alive():  # closed its pipe but does not exit
                    state[0].kill()
                    state[0].join()
                rest = [(i, j) for i, j in state[1] if i not in out]
                code = state[0].exitcode
                if state[2] is not None and state[2] not in out:  # ended inside a job, whatever its code
                    out[state[2]] = (f"did not finish in {job_timeout_s:g} s (compile or first launch hung): "
                                     f"its process was killed" if state[5] == state[2]
                                     else f"the compiling process died (exit code {code})")
                    rest = [(i, j) for i, j in rest if i != state[2]]
                elif rest and state[3] == 0:  # ended before its first job: it would again
                    for i, _ in rest:
                        out[i] = f"the compiling process died before its first job (exit code {code})"
                    rest = []
                if rest:
                    start(rest)
                continue
            state[3] += 1
            if msg[0] == "start":
                state[2] = msg[1]
                state[4] = time.monotonic()
            else:
                out[msg[1]] = msg[2]
                state[2] = None
    return out


def precompile(jobs: list, workers: int, contract_id: str | None = None,
               out_fp32: bool = False) -> tuple[float, list, set]:
    """Compile ``jobs`` [(K, N, schedule, fields)] under ``contract_id`` (default gemm.bf16.v1), with
    bf16 (or, ``out_fp32``, fp32) outputs, in ``workers`` processes; (seconds, error lines, the
    (K, N, candidate key) of every job that did not compile). Callers must not launch those in
    their own process: a compiler abort would end it. With one worker (or one kernel) the jobs run in
    this process, without the per-job time limit of the parallel path."""
    from rlk.kernels.gemm import contract  # noqa: PLC0415

    cid = contract_id or contract.CONTRACT_ID
    t0 = time.time()
    # One compile per kernel: the code depends on (K, split) through SEG_STEPS, not on N, except
    # for N_PROGS decode, whose tile width and column range follow N.
    groups = {}
    for K, N, s, c in jobs:
        key = [K, contract.segments(K, N, cid), s, c, N if c.get("N_PROGS") else None]
        groups.setdefault(json.dumps(key, sort_keys=True), []).append((K, N, s, c))
    reps = [(g[0][0], g[0][1], g[0][2], g[0][3], cid, out_fp32) for g in groups.values()]
    if workers <= 1 or len(reps) < 2:
        res = {i: _compile_one(j) for i, j in enumerate(reps)}
    else:
        res = _compile_parallel(reps, min(workers, len(reps)))
    errors, failed = [], set()
    for i, members in enumerate(groups.values()):
        if res.get(i) is not None:
            K, N, s, c = members[0]
            errors.append(f"{K}x{N} {_key((s, c))}: {res[i]}")
            failed.update((k, n, _key((ss, cc))) for k, n, ss, cc in members)
    return time.time() - t0, errors, failed
