"""Offline tuner of the free (bit-neutral) launch fields of contract gemm.bf16.v1. GPU script.

  python -m rlk.kernels.gemm.gemm_tune --out gemm_sm90_tuned.json [--shapes qkv,o] [--budget-s 400]
      [--workers 14] [--no-rule] [--weights warm|cold] [--max-m 128] [--contract gemm.bf16.v2]
  python -m rlk.kernels.gemm.gemm_tune --install gemm_sm90_tuned.json \
      --table kernels/rlk/kernels/gemm/configs/sm90.json --record docs/results/gemm_tune_h200.json

What it does, in order:

1. **Compile** every (shape, candidate) kernel in ``--workers`` parallel processes (they fill
   Triton's on-disk cache; the timing process then loads instead of compiling).
2. **Per-shape buckets** for the Qwen3-8B list (TP1 and TP4): at every M of ``M_LIST`` it times
   the candidates of that M's regime (decode kernel and TMA prefill tiles, ``candidates(M)``),
   checks each one's bf16 output byte for byte against the reference config's first M rows, at M
   and at an odd neighbour (a differing candidate is rejected and reported), and times cuBLAS (``torch.matmul``) on the same
   tensors. The bucket list keeps a config over consecutive M while it stays within ``TIE`` of
   that M's best, so nearby M share a kernel.
3. **The default rule** (``default_buckets``, for every (K, N) without an entry: the other Qwen3
   sizes, any new model): for M <= ``RULE_MAX_M`` the configs that did best over the 8B shapes are
   timed on the "tune" sizes of ``QWEN3_SIZES`` and the one with the best geometric-mean ratio to
   cuBLAS is kept per M; above, the table's default prefill config. The "holdout" sizes are then
   timed with the rule (and with the previous rule) against cuBLAS: evaluation only.

Only schedule fields change: the split count stays ``contract.split_k(K, N)``. Timings: CUDA graph
replays of back-to-back calls (median of 3). ``--weights cold`` times every call (candidates and
cuBLAS alike) on the next copy of a ring of equal weight copies whose bytes exceed the L2 cache
``COLD_FACTOR`` times (:class:`WeightRing`), so that the weights stream from HBM as they do in a
decode step, where each layer's GEMM reads weights no earlier kernel left in L2; ``warm`` (the
default) reuses one weight tensor, which the L2 partly holds when it is smaller than the cache.
Writes a table in the format ``schedule.py`` reads (use it with ``RLK_GEMM_TABLE=FILE``), with
every measurement under "tuning"; a partial table is written after each shape, so a run cut short
keeps what it measured.

``--contract gemm.bf16.v2`` tunes the same free fields under v2's fixed K segments, adding decode
tiles wide in N (``SPLIT_DECODE_TILES``: under v2 the segments fill the SMs); the candidates are
checked against the v2 reference config's bytes. It is a measurement of what v2 could reach: the
checked-in table serves v1 and ``--install`` refuses a v2 output. ``--max-m`` limits the M list
(the default rule is fitted only by a v1 run over the whole list).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch

from rlk.kernels.gemm.gemm_compile import _dev, _key, _sync, precompile
from rlk.kernels.gemm import gemm_table
from rlk.kernels.gemm.gemm_table import merge_buckets  # noqa: F401  (tests)
from rlk.testing.shapes import (QWEN3_8B_GEMMS, QWEN3_OTHER_GEMMS, QWEN3_RULE_HOLDOUT_SIZES,
                                QWEN3_RULE_TUNE_SIZES)

# vLLM's decode batch sizes and prefill chunk sizes fall between these points.
M_LIST = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192)
RULE_MAX_M = 1024  # the default rule is tuned up to here; above it the default prefill config
TIE = 1.02  # a config within 2% of an M's best may keep its bucket running
RULE_CANDS = 4  # per M, this many best configs over the 8B shapes are tried for the rule
REF = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
       "FLAT": 0, "PERSISTENT": 0, "TMA": 0}
# Decode kernel (pointer loads, split-K in parallel programs): (BLOCK_N, BLOCK_K, warps, stages).
# The last row: deeper pipelines and 256-wide K steps (more weight bytes in flight per SM).
DECODE_TILES = ((16, 128, 4, 4), (16, 128, 4, 5), (16, 256, 4, 3), (32, 64, 4, 4), (32, 128, 4, 3),
                (32, 128, 4, 4), (32, 256, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 4, 4),
                (64, 128, 8, 3), (32, 128, 8, 4),
                (16, 256, 4, 4), (32, 128, 4, 5), (32, 256, 4, 4), (64, 256, 4, 3))
# Prefill kernel (TMA, flat K loop, in-register fold): (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages,
# persistent).
PREFILL_TILES = ((64, 32, 128, 4, 4, 0), (64, 64, 128, 4, 4, 0), (64, 64, 64, 4, 5, 0), (64, 128, 64, 4, 4, 0),
                 (64, 128, 128, 4, 3, 0), (64, 256, 64, 8, 3, 0), (64, 128, 64, 4, 4, 1), (128, 64, 64, 4, 4, 0),
                 (128, 64, 128, 8, 3, 0), (128, 128, 64, 8, 4, 0), (128, 128, 128, 8, 3, 0), (128, 256, 64, 8, 3, 0),
                 (128, 256, 64, 8, 3, 1), (128, 128, 64, 8, 4, 1),
                 # persistent walks as one flattened pipeline (PERSISTENT 2; at 128 x 256 its buffers
                 # need 278,552 bytes of shared memory, over sm_90's 232,448: not a candidate)
                 (64, 64, 64, 4, 5, 2), (64, 128, 64, 4, 4, 2), (128, 128, 64, 8, 4, 2))

# Mid-M prefill tiles of three column sub-tiles (NSUB 3: 96, 192 and 384 wide), widths that give
# about one wave of tiles where powers of two give 1.1-1.5 (cuBLAS runs 96-, 144- and 192-wide
# tiles there): (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), BLOCK_N per sub-tile.
NSUB_TILES = ((64, 32, 64, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (128, 32, 64, 4, 4),
              (128, 64, 64, 8, 3))

# The same kernel with row tiles of 16 and 32 (mma.sync instead of wgmma, a form the contract
# lists): TMA weight streams at decode batch sizes without computing 64-row tiles for M <= 32.
SMALL_M_TILES = ((16, 16, 256, 4, 4, 0), (16, 32, 128, 4, 4, 0), (16, 32, 256, 4, 3, 0), (16, 64, 128, 4, 4, 0),
                 (16, 32, 128, 4, 4, 1), (32, 32, 128, 4, 4, 0), (32, 64, 128, 4, 4, 0), (32, 32, 256, 4, 3, 0))
# Decode with N cut evenly over a program count instead of BLOCK_N tiles (one wave on 132 SMs, or
# two or three programs per SM): (N_PROGS, BLOCK_K, warps, stages); BLOCK_N follows the range.
RANGE_TILES = ((132, 128, 4, 4), (132, 256, 4, 3), (264, 128, 4, 4), (264, 256, 4, 3), (396, 128, 4, 4))
# Decode at mid M (64 < M <= 256) with 128-row tiles (one row tile up to M = 128: the weights
# stream once): (BLOCK_N, BLOCK_K, warps, stages), shared memory within sm_90's 227 KB at 128 rows;
# the column ranges with 128-wide K steps (RANGE_TILES' 256-wide ones overflow it at 128 rows).
MID_DECODE_TILES = ((32, 128, 4, 4), (64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 8, 3))
MID_RANGE_TILES = tuple(t for t in RANGE_TILES if t[1] == 128)
MID_MAX_M = 256
COLD_FACTOR = 4  # a weight ring's bytes are at least this many times the L2 cache


def ring_size(weight_bytes: int, l2_bytes: int, factor: int = COLD_FACTOR) -> int:
    """Copies of a weight for cold timing: at least two, and together ``factor`` times the L2."""
    if weight_bytes <= 0 or l2_bytes < 0 or factor < 1:
        raise ValueError(f"ring_size: weight_bytes {weight_bytes} must be > 0, l2_bytes {l2_bytes} >= 0, "
                         f"factor {factor} >= 1")
    return max(2, math.ceil(factor * l2_bytes / weight_bytes))


def l2_bytes() -> int:
    """The GPU's L2 cache size (0 on the CPU)."""
    return int(torch.cuda.get_device_properties(0).L2_cache_size) if torch.cuda.is_available() else 0


class WeightRing:
    """``copies`` equal copies of a weight and a round-robin over them.

    A benchmark that calls ``fn(ring.next())`` back to back reads each copy only after all the
    others (CUDA graph captures unroll the calls, so the rotation is in the graph too): with
    ``ring_size`` copies no call finds its weights in L2, as in a decode step through the layers.
    """

    def __init__(self, w: torch.Tensor, copies: int):
        if copies < 1:
            raise ValueError(f"WeightRing: copies must be >= 1, got {copies}")
        self.ws = [w] + [w.clone() for _ in range(copies - 1)]
        self._i = 0

    def next(self) -> torch.Tensor:
        w = self.ws[self._i]
        self._i = (self._i + 1) % len(self.ws)
        return w

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.ws)


def _dec(bm, bn, bk, nw, ns):
    return ("decode", {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns})


def _range(bm, n_progs, bk, nw, ns):
    return ("decode", {"BLOCK_M": bm, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns, "N_PROGS": n_progs})


def _pre(bm, bn, bk, nw, ns, pers, nsub=1):
    sub = {"NSUB": nsub} if nsub > 1 else {}
    return ("prefill", {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": nw,
                        "num_stages": ns, "FLAT": 1, "PERSISTENT": pers, "TMA": 1, **sub})


def candidates(M: int) -> list:
    """(schedule, fields) tried at M: decode with a BLOCK_M covering M (16 or 64) up to M = 512;
    prefill tiles with BLOCK_M 16 / 32 covering M up to M = 32 (SMALL_M_TILES), with BLOCK_M 64 at
    small M, all tiles at mid M, the large ones from M = 2048; up to M = 64 decode over N_PROGS
    column ranges (RANGE_TILES); at 64 < M <= 256 decode with 128-row tiles (MID_DECODE_TILES) and
    column ranges with 64- and 128-row tiles (MID_RANGE_TILES); at 64 < M <= 1024 tiles of three
    column sub-tiles (NSUB_TILES)."""
    out = []
    if M <= 512:
        for bm in ((16, 64) if M <= 16 else (64,)):
            out += [_dec(bm, *t) for t in DECODE_TILES]
    for t in SMALL_M_TILES:
        if M <= t[0] and (t[0] == 16 or M > 16):
            out.append(_pre(*t))
    for t in PREFILL_TILES:
        if (M <= 64 and t[0] == 64) or 64 < M <= 1024 or (M > 1024 and (t[0] == 128 or t[1] == 256)):
            out.append(_pre(*t))
    if 64 < M <= 1024:
        out += [_pre(*t, 0, 3) for t in NSUB_TILES]
    if M <= 64:
        bm = 16 if M <= 16 else 32 if M <= 32 else 64
        out += [_range(bm, *t) for t in RANGE_TILES]
    elif M <= MID_MAX_M:
        out += [_dec(128, *t) for t in MID_DECODE_TILES]
        out += [_range(bm, *t) for bm in (64, 128) for t in MID_RANGE_TILES]
    return out


ALL_CANDIDATES = list({json.dumps(c, sort_keys=True): c for m in M_LIST for c in candidates(m)}.values())

# Decode tiles wider in N, for contracts whose split does not depend on N (gemm.bf16.v2: a segment
# per 1024 of K): there the segments, not narrow N tiles, fill the SMs, and a wide tile reads the
# activations fewer times. (BLOCK_N, BLOCK_K, warps, stages).
SPLIT_DECODE_TILES = ((64, 256, 4, 3), (128, 64, 4, 4), (128, 128, 4, 3), (128, 128, 8, 3), (256, 64, 8, 3))


def split_candidates(M: int) -> list:
    """The extra decode candidates of a ``--contract gemm.bf16.v2`` run at M (up to M = 128)."""
    if M > 128:
        return []
    return [_dec(bm, *t) for bm in ((16, 64) if M <= 16 else (64,)) for t in SPLIT_DECODE_TILES]


def bench_ms(fn, budget_ms: float = 2.0) -> float:
    """Median per-call time of ``fn`` replayed from a CUDA graph of back-to-back calls (on the
    CPU, for the smoke test only: wall time of one call)."""
    if _dev() == "cpu":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    torch.cuda.synchronize()
    reps = max(1, min(20, int(budget_ms / max(e0.elapsed_time(e1), 1e-3))))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / reps)
    return sorted(times)[1]


def _geo(vals) -> float:
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# ----------------------------------------------------------------------------- measurement
WEIGHTS = ("warm", "cold")


class Tuner:
    def __init__(self, budget_s: float, weights: str = "warm", contract_id: str | None = None):
        from rlk.kernels.gemm import contract, launch  # noqa: PLC0415

        if weights not in WEIGHTS:
            raise ValueError(f"Tuner: weights must be one of {WEIGHTS}, got {weights!r}")
        self.contract = contract.check_contract_id(contract_id or contract.CONTRACT_ID)
        self.launch = launch
        self.deadline = time.time() + budget_s
        self.weights = weights
        self.rings = {}  # shape name -> copies of its weight in the cold ring
        self.compared = 0  # (candidate, M) outputs compared byte for byte with the reference
        self.failed = set()  # (K, N, candidate key) that did not compile: never launched here

    def over(self) -> bool:
        return time.time() > self.deadline

    def time_cand(self, x, w, ref, cand, m, ring=None):
        """ms of ``cand`` at M = m, or a string saying why it was rejected / failed; with a
        :class:`WeightRing` each timed call takes the ring's next copy (the bytes are checked on ``w``)."""
        sched, cfg = cand
        c = self.contract
        if (w.shape[1], w.shape[0], _key(cand)) in self.failed:
            return "error: did not compile (tuning.compile.errors)"
        if ring is None:
            fn = (lambda: self.launch.gemm(x[:m], w, schedule=sched, config=cfg, contract=c))
        else:
            fn = (lambda: self.launch.gemm(x[:m], ring.next(), schedule=sched, config=cfg, contract=c))
        try:
            # Bytes at M and at an odd neighbour (M + 1, or M - 1 at the largest M).
            for mm in (m, m + 1 if m < x.shape[0] else m - 1):
                y = self.launch.gemm(x[:mm], w, schedule=sched, config=cfg, contract=c)
                _sync()
                nd = int((y.view(torch.int16) != ref[:mm].view(torch.int16)).sum().item())
                self.compared += 1
                if nd:
                    return f"rejected: {nd} bf16 elements differ from the reference at M={mm}"
            return bench_ms(fn)
        except Exception as e:  # noqa: BLE001  (compile/smem failures are recorded, not hidden)
            return f"error: {type(e).__name__}: {str(e)[:160]}"

    def measure(self, name, K, N, cands_of_m, m_list, seed=0):
        """{m: {"cublas": ms, "cands": {key: ms | reason}}} for one shape."""
        g = torch.Generator(device=_dev()).manual_seed(seed)
        w = torch.randn(N, K, device=_dev(), dtype=torch.bfloat16, generator=g)
        x = torch.randn(max(m_list), K, device=_dev(), dtype=torch.bfloat16, generator=g)
        ref = self.launch.gemm(x, w, schedule="prefill", config=REF, contract=self.contract)
        ring = None
        if self.weights == "cold":
            ring = WeightRing(w, ring_size(w.numel() * w.element_size(), l2_bytes()))
            self.rings[name] = len(ring.ws)
        res = {}
        for m in m_list:
            if ring is None:
                cub = bench_ms(lambda m=m: torch.matmul(x[:m], w.T))
            else:
                cub = bench_ms(lambda m=m: torch.matmul(x[:m], ring.next().T))
            times = {}
            for cand in cands_of_m(m):
                if self.launch.range_fits(N, *cand):  # N_PROGS ranges wider than any listed tile: not a candidate here
                    times[_key(cand)] = self.time_cand(x, w, ref, cand, m, ring)
            res[m] = {"cublas": cub, "cands": times}
            ok = {k: v for k, v in times.items() if not isinstance(v, str)}
            best = min(ok.values()) if ok else float("nan")
            print(f"  {name:<14} M={m:<5} cuBLAS {cub * 1e3:8.2f} us  best {best * 1e3:8.2f} us  "
                  f"ratio {best / cub:6.3f}  ({len(ok)}/{len(times)} ok)", flush=True)
        del x, w, ref, ring
        return res


def choose_run(per_m: dict, m_list, tie: float = TIE) -> list:
    """[(m, key)] per M: the fastest config, except that the previous M's config is kept while it
    stays within ``tie`` of the best (fewer distinct kernels, buckets that do not flip on noise);
    when a new config is needed, the near-best one that stays near-best for the most following M."""
    near = {}
    for m in m_list:
        ok = {k: v for k, v in per_m[m].items() if not isinstance(v, str)}
        if not ok:
            near[m] = {}
            continue
        best = min(ok.values())
        near[m] = {k: v for k, v in ok.items() if v <= tie * best}
    out, cur = [], None
    for i, m in enumerate(m_list):
        if not near[m]:
            out.append((m, None))
            continue
        if cur not in near[m]:
            def reach(k, i=i):
                n = 0
                for mm in m_list[i:]:
                    if k not in near[mm]:
                        break
                    n += 1
                return n
            cur = max(near[m], key=lambda k: (reach(k), -near[m][k]))
        out.append((m, cur))
    return out


def to_buckets(run: list, by_key: dict, open_tail=None) -> list:
    """Bucket list from [(m, key)]: consecutive M with one key merge; the last bucket is open
    (``open_tail`` replaces it when given: [None, schedule, fields])."""
    bks = []
    for m, k in run:
        if k is None:
            continue
        sched, cfg = by_key[k]
        if bks and bks[-1][1] == sched and bks[-1][2] == cfg:
            bks[-1][0] = m
        else:
            bks.append([m, sched, dict(cfg)])
    if open_tail is not None:
        bks.append(list(open_tail))
    elif bks:
        bks[-1][0] = None
    return bks


def install(tuned: str, table_out: str, record_out: str) -> None:
    """:func:`rlk.kernels.gemm.gemm_table.install` with this tuner's M list and shapes."""
    gemm_table.install(tuned, table_out, record_out, M_LIST, QWEN3_8B_GEMMS)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--install"]:
        ap = argparse.ArgumentParser(description="install a tuner output as the checked-in sm_90 table")
        ap.add_argument("--install", required=True, metavar="TUNED_JSON")
        ap.add_argument("--table", required=True)
        ap.add_argument("--record", required=True)
        a = ap.parse_args(argv)
        install(a.install, a.table, a.record)
        return 0
    ap = argparse.ArgumentParser(description="gemm.bf16.v1 schedule tuner (GPU)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="", help="comma-separated names from QWEN3_8B_GEMMS (default: all)")
    ap.add_argument("--budget-s", type=float, default=400.0,
                    help="after this, remaining shapes are skipped (a partial table is still written)")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (mp.cpu_count() or 2) - 2)),
                    help="compile processes (default: the cores less two, at most 14)")
    ap.add_argument("--no-rule", action="store_true", help="skip the default rule and its holdout evaluation")
    ap.add_argument("--contract", default="gemm.bf16.v1", choices=["gemm.bf16.v1", "gemm.bf16.v2"],
                    help="the contract whose split the candidates run under; a v2 run is a measurement "
                         "(its table cannot be installed: the checked-in table serves v1)")
    ap.add_argument("--max-m", type=int, default=None, help="tune only the M of M_LIST up to this")
    ap.add_argument("--weights", default="warm", choices=WEIGHTS,
                    help="cold: every timed call reads the next copy of a weight ring larger than the L2 "
                         "(weights from HBM, as in decode); warm: one weight, back to back")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        print("gemm_tune needs a CUDA GPU (or TRITON_INTERPRET=1 for its smoke test)", file=sys.stderr)
        return 2
    import triton  # noqa: PLC0415

    from rlk.kernels.gemm import contract, schedule  # noqa: PLC0415

    t0 = time.time()
    cid = args.contract
    m_list = tuple(m for m in M_LIST if args.max_m is None or m <= args.max_m)
    if not m_list:
        print(f"--max-m {args.max_m}: no M of {M_LIST} left", file=sys.stderr)
        return 2
    tuner = Tuner(args.budget_s, weights=args.weights, contract_id=cid)
    cands_of_m = candidates if cid == contract.CONTRACT_ID else (lambda m: candidates(m) + split_candidates(m))
    all_cands = list({json.dumps(c, sort_keys=True): c for m in m_list for c in cands_of_m(m)}.values())
    base = schedule.load_table("sm_90")
    names = args.shapes.split(",") if args.shapes else list(QWEN3_8B_GEMMS)
    unknown = [n for n in names if n not in QWEN3_8B_GEMMS]
    if unknown:
        print(f"unknown shapes {unknown} (have {sorted(QWEN3_8B_GEMMS)})", file=sys.stderr)
        return 2
    shapes8 = {}
    for n in names:
        shapes8.setdefault(QWEN3_8B_GEMMS[n], n)
    by_key = {_key(c): c for c in [*ALL_CANDIDATES, *all_cands]}
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "the CPU interpreter (smoke test)"
    doc = {"arch": "sm_90",
           "status": f"tuned by gemm_tune on {gpu} (torch {torch.__version__}, "
                     f"triton {triton.__version__}) {time.strftime('%Y-%m-%d')}; every chosen config byte-identical "
                     f"to the reference config at the timed M; split_k restates the rule of {cid}; timed with "
                     f"{args.weights} weights",
           "decode_max_m": base["decode_max_m"], "default": base["default"],
           "shapes": {}, "tuning": {"reference": REF, "m_list": list(m_list), "tie": TIE, "shapes": {},
                                    "contract": cid,
                                    "weights": args.weights, "l2_bytes": l2_bytes(),
                                    "ring_copies": tuner.rings}}
    if "default_buckets" in base:
        doc["default_buckets"] = base["default_buckets"]

    def write():
        doc["tuning"]["seconds"] = round(time.time() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    from rlk.kernels.gemm import launch  # noqa: PLC0415

    jobs = [(K, N, *c) for (K, N) in shapes8 for c in all_cands if launch.range_fits(N, *c)]
    secs, errs, failed = precompile(jobs, args.workers, cid)
    tuner.failed |= failed
    for e in errs:
        print(f"compile error: {e}", flush=True)
    print(f"compiled {len(jobs)} kernels in {secs:.0f} s with {args.workers} workers; {len(errs)} failed", flush=True)
    doc["tuning"]["compile"] = {"jobs": len(jobs), "seconds": round(secs, 1), "errors": errs}

    ratios = []
    for (K, N), name in shapes8.items():
        if tuner.over():
            print(f"budget spent: {name} and later shapes not tuned", flush=True)
            doc["tuning"].setdefault("skipped", []).append(name)
            continue
        print(f"{name} K={K} N={N} split_k={contract.split_k(K, N, cid)}", flush=True)
        res = tuner.measure(name, K, N, cands_of_m, m_list)
        per_m = {m: r["cands"] for m, r in res.items()}
        run = choose_run(per_m, m_list)
        entry = {"split_k": contract.split_k(K, N, cid)}
        for sched in contract.SCHEDULES:  # the schedule base configs (forced-schedule callers)
            if sched in base["shapes"].get(f"{K}x{N}", {}):
                entry[sched] = base["shapes"][f"{K}x{N}"][sched]
        entry["buckets"] = to_buckets(run, by_key)
        doc["shapes"][f"{K}x{N}"] = entry
        row = {"shape": name, "K": K, "N": N}
        for m, k in run:
            row[f"M{m}"] = None if k is None else round(per_m[m][k] / res[m]["cublas"], 3)
        ratios.append(row)
        doc["tuning"]["shapes"][name] = {
            "K": K, "N": N, "chosen": {str(m): k for m, k in run},
            "cublas_us": {str(m): round(r["cublas"] * 1e3, 2) for m, r in res.items()},
            "cands_us": {str(m): {k: (v if isinstance(v, str) else round(v * 1e3, 2)) for k, v in r["cands"].items()}
                         for m, r in res.items()}}
        doc["tuning"]["ratio_vs_cublas"] = ratios
        write()

    if not args.no_rule and not tuner.over():
        if cid != contract.CONTRACT_ID or m_list != M_LIST:
            print("the default rule is fitted for v1 over the whole M list only: skipped", flush=True)
        else:
            rule(tuner, doc, contract, schedule, by_key, args.workers)
    write()
    print("strict / cuBLAS time (chosen configs, CUDA graph replays):")
    print(f"{'shape':<14}" + "".join(f"{m:>7}" for m in m_list))
    for r in ratios:
        print(f"{r['shape']:<14}" + "".join(f"{(r.get(f'M{m}') or float('nan')):>7.3f}" for m in m_list))
    n_rej = sum(1 for s in doc["tuning"]["shapes"].values() for per in s["cands_us"].values()
                for v in per.values() if isinstance(v, str) and v.startswith("rejected"))
    doc["tuning"]["byte_comparisons"] = {"compared": tuner.compared, "rejected": n_rej}
    write()
    print(f"wrote {args.out} in {time.time() - t0:.0f} s; {tuner.compared} outputs compared byte for byte, "
          f"{n_rej} candidate timings rejected for differing bytes")
    return 0 if n_rej == 0 else 1


def rule(tuner: Tuner, doc: dict, contract, schedule, by_key: dict, workers: int) -> None:
    """Fit ``default_buckets`` on the tune sizes; evaluate it on the holdout sizes."""
    t_shapes = doc["tuning"]["shapes"]
    rule_m = [m for m in M_LIST if m <= RULE_MAX_M]
    pick = {}
    for m in rule_m:
        scores = {}
        for s in t_shapes.values():
            per = {k: v for k, v in s["cands_us"][str(m)].items() if not isinstance(v, str)}
            if per:
                best = min(per.values())
                for k, v in per.items():
                    scores.setdefault(k, []).append(v / best)
        # The rule serves any N; N_PROGS ranges follow N and can outgrow the widest tile: not rule candidates.
        full = [k for k, v in scores.items() if len(v) == len(t_shapes) and not by_key[k][1].get("N_PROGS")]
        pick[m] = sorted(full, key=lambda k: _geo(scores[k]))[:RULE_CANDS]
    tune_shapes = {n: kn for n, kn in QWEN3_OTHER_GEMMS.items() if n.split("_")[0] in QWEN3_RULE_TUNE_SIZES}
    hold_shapes = {n: kn for n, kn in QWEN3_OTHER_GEMMS.items() if n.split("_")[0] in QWEN3_RULE_HOLDOUT_SIZES}
    keys = sorted({k for ks in pick.values() for k in ks})
    jobs = [(K, N, *by_key[k]) for (K, N) in set(tune_shapes.values()) for k in keys]
    secs, errs, failed = precompile(jobs, workers)
    tuner.failed |= failed
    print(f"rule: compiled {len(jobs)} kernels in {secs:.0f} s; {len(errs)} failed", flush=True)
    meas = {}
    for name, (K, N) in tune_shapes.items():
        res = tuner.measure(name, K, N, lambda m: [by_key[k] for k in pick.get(m, [])], rule_m, seed=3)
        meas[name] = res
    per_m = {}
    for m in rule_m:
        per_m[m] = {}
        for k in pick[m]:
            r = [meas[n][m]["cands"][k] / meas[n][m]["cublas"] for n in meas
                 if not isinstance(meas[n][m]["cands"].get(k), str)]
            if len(r) == len(meas):
                per_m[m][k] = _geo(r)  # geometric-mean ratio to cuBLAS over the tune sizes
    run = choose_run(per_m, rule_m)
    default_tail = [None, "prefill", None]
    doc["default_buckets"] = to_buckets(run, by_key, open_tail=default_tail)
    doc["tuning"]["rule"] = {
        "tune_sizes": list(QWEN3_RULE_TUNE_SIZES), "holdout_sizes": list(QWEN3_RULE_HOLDOUT_SIZES),
        "candidates": {str(m): v for m, v in pick.items()},
        "geo_ratio_vs_cublas": {str(m): {k: round(v, 3) for k, v in d.items()} for m, d in per_m.items()},
        "tune_cands_us": {n: {str(m): {"cublas": round(r["cublas"] * 1e3, 2),
                                       **{k: (v if isinstance(v, str) else round(v * 1e3, 2))
                                          for k, v in r["cands"].items()}} for m, r in res.items()}
                          for n, res in meas.items()},
        "compile": {"jobs": len(jobs), "seconds": round(secs, 1), "errors": errs}}
    # Holdout: the new rule and the previous one, resolved as launch.plan resolves a bucket.
    old_rule = [[int(doc["decode_max_m"]), "decode", None], [None, "prefill", None]]
    evals = {}
    for label, bks in (("rule", doc["default_buckets"]), ("previous_rule", old_rule)):
        for name, (K, N) in hold_shapes.items():
            for m in M_LIST:
                sched, fields = schedule.bucket_at(bks, m)
                cfg = schedule.bucket_config(K, N, m, sched, fields)
                evals.setdefault(name, {}).setdefault(str(m), {})[label] = (sched, cfg)
    jobs = list({json.dumps([K, N, s, c], sort_keys=True): (K, N, s, c) for name, (K, N) in hold_shapes.items()
                 for per in evals[name].values() for s, c in per.values()}.values())
    secs, errs, failed = precompile(jobs, workers)
    tuner.failed |= failed
    print(f"holdout: compiled {len(jobs)} kernels in {secs:.0f} s; {len(errs)} failed", flush=True)
    rows = []
    for name, (K, N) in hold_shapes.items():
        res = tuner.measure(name, K, N, lambda m, name=name: list(evals[name][str(m)].values()), M_LIST, seed=5)
        row = {"shape": name, "K": K, "N": N, "split_k": contract.split_k(K, N)}
        for m in M_LIST:
            cub = res[m]["cublas"]
            for label, cand in evals[name][str(m)].items():
                v = res[m]["cands"][_key(cand)]
                row.setdefault(label, {})[f"M{m}"] = v if isinstance(v, str) else round(v / cub, 3)
        rows.append(row)
    doc["tuning"]["rule"]["holdout_ratio_vs_cublas"] = rows
    for r in rows:
        vals = [v for v in r["rule"].values() if not isinstance(v, str)]
        print(f"holdout {r['shape']:<14} rule/cuBLAS {min(vals):.3f}-{max(vals):.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
