"""Rollout pattern (the replay executor): a rollout engine's execution pattern, not a server.

Paged KV cache ``[num_blocks, block_size, Hk, D]`` per layer with block tables; pages handed
out from a free list shuffled by a seeded RNG (page order differs from sequence order; freed
pages go to the back of the list and are reused by later requests); chunked prefill;
continuous batching (requests arrive at different steps, finish at different lengths, and a
seeded jitter defers some ready requests each step, so batch composition changes); sampling
with a seeded ``torch.Generator`` (Gumbel-max over fp32 softmax of the logits from the route's
``logits_for_sampling``, temperature 1.0); the selected-token logp of every sampled token taken
from the same LM-head pass (strict: ``x_target - lse`` of ``linear_logp``, byte-identical to its
``logp``; replays with forced tokens call ``linear_logp`` itself, and L1 checks they agree),
and the entropy of each distribution sampled from (``RolloutResult.entropy``: the fixture's
distribution statistics, :mod:`rlk.models.qwen3.distribution`).

With ``forced`` responses the executor replays given tokens instead of sampling (same
schedule), which is how a frozen fixture is re-run.

Decode steps (every scheduled request has one query) can run at bucket shapes
(``RolloutConfig.pad_decode``): the batch is padded to the smallest of ``decode_buckets`` that
holds it (padding rows: token 0, position 0, slot -1, kv length 0, a zero block-table row) and
the block table has one width for the whole rollout, so each bucket has static shapes. With
``cuda_graphs`` (default: on when the model is on CUDA) each bucket's step is captured once as a
CUDA graph and replayed (:mod:`rlk.replay.decode_graphs`); prefill and mixed steps, and decode
steps larger than the largest bucket, run eagerly. Sampling, logits and logp run eagerly on the
real rows only, except with ``RolloutConfig.step_logp`` in a forced replay: then a bucket step
also computes each row's logp of its forced token (inside the graph; padding rows dropped). On
the strict route the logp are bitwise the same either way (gate L1, "graph vs eager"; logp.v2
rows do not depend on the row count).
"""

from __future__ import annotations

import dataclasses
import random
import time

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.distribution import row_entropy
from rlk.models.qwen3.routes import PagedMeta
from rlk.replay import decode_graphs
from rlk.replay.staging import PinnedRing


@dataclasses.dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    arrival_step: int = 0


@dataclasses.dataclass
class RolloutConfig:
    block_size: int = 16
    num_blocks: int | None = None  # default: exactly what every request needs, + 1 spare
    max_batch: int = 4  # running requests at most
    chunk_size: int = 16  # prefill tokens per request per step at most
    token_budget: int | None = None  # tokens per step at most (default max_batch + chunk_size)
    page_seed: int = 1
    sample_seed: int = 2
    jitter: float = 0.25  # probability a ready request is deferred this step (seeded)
    jitter_seed: int = 3
    cuda_graphs: bool | None = None  # decode steps as CUDA graphs per bucket (None: on iff the model is on CUDA)
    decode_buckets: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # padded decode batch sizes
    pad_decode: bool | None = None  # pad decode steps to a bucket (None: same as cuda_graphs)
    # Forced replays: bucket steps compute their rows' logp inside the step (the CUDA graph)
    # instead of an eager LM-head launch per step. Same bytes. H200, L5 size: the strict rollout's
    # Python work halves under cProfile; in wall time the native rollout gains (84 -> 77 ms), the
    # strict one stays at 63 ms (docs/results/e2e_runs_2026-12-01/run11-12_step_logp_ablation.md).
    step_logp: bool = True

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RolloutResult:
    responses: list[list[int]]
    logp: list[torch.Tensor]  # per request, [len(response)] fp32 (device of the model)
    page_tables: list[list[int]]
    steps: int
    batch_sizes: list[int]  # requests per step
    step_tokens: list[int]
    composition_changes: int  # steps whose set of requests differs from the previous step's
    seconds: float
    probes: list[dict] | None = None  # per request: name -> [len, H] (rows by position)
    graph_captures: int = 0  # CUDA graphs captured (one per bucket used)
    graph_replays: int = 0  # decode steps run by replaying a graph
    bucket_steps: int = 0  # decode steps run at bucket shapes (graph or eager)
    padded_steps: int = 0  # bucket steps with at least one padding row
    over_bucket_steps: int = 0  # decode steps larger than the largest bucket (eager, unpadded)
    # Sampling runs only: per request, [len(response)] fp32 entropy (nats) of the distribution
    # each token was sampled from (rlk.models.qwen3.distribution.row_entropy); None when forced.
    entropy: list[torch.Tensor] | None = None


class _Seq:
    def __init__(self, idx, req: Request, forced):
        self.idx, self.req = idx, req
        self.prompt = list(req.prompt)
        self.generated: list[int] = []
        self.logp: list[torch.Tensor] = []
        self.entropy: list[torch.Tensor] = []
        self.pages: list[int] = []
        self.computed = 0  # tokens whose K/V are in the cache
        self.forced = forced

    @property
    def tokens(self):
        return self.prompt + self.generated

    def done(self):
        return len(self.generated) >= self.req.max_new_tokens


def pages_needed(requests, block_size):
    # The last sampled token is never fed back, so a request caches prompt + max_new - 1 tokens.
    return sum(-(-(len(r.prompt) + r.max_new_tokens - 1) // block_size) for r in requests)


def check_tokens(vocab_size: int, *token_lists) -> None:
    """Host-side range check of every token id (so launches need not read device memory)."""
    for lists in token_lists:
        for i, toks in enumerate(lists or ()):
            bad = [t for t in toks if not 0 <= int(t) < vocab_size]
            if bad:
                raise UnsupportedConfigError(f"sequence {i}: token id {bad[0]} outside [0, {vocab_size})")


def decode_mode(rc: RolloutConfig, device: torch.device, probes: bool = False) -> tuple[bool, bool, tuple]:
    """``(cuda_graphs, pad_decode, buckets)`` in effect for ``rc`` on ``device``.

    ``probes`` force the eager unpadded path (probe rows are read per step, by request).
    """
    graphs = rc.cuda_graphs if rc.cuda_graphs is not None else device.type == "cuda"
    pad = rc.pad_decode if rc.pad_decode is not None else graphs
    if probes:
        return False, False, ()
    if graphs and device.type != "cuda":
        raise UnsupportedConfigError(f"cuda_graphs=True needs the model on a CUDA device (it is on {device})")
    if graphs and not pad:
        raise UnsupportedConfigError("cuda_graphs=True needs pad_decode (a graph has static shapes per bucket)")
    buckets = tuple(int(b) for b in rc.decode_buckets)
    if pad and (not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets))):
        raise UnsupportedConfigError(f"decode_buckets must be increasing positive ints, got {rc.decode_buckets!r}")
    return graphs, pad, buckets


def _graph_session(model, num_blocks: int, block_size: int, width: int):
    """(kv_cache, DecodeGraphs) kept on the model for this cache shape and table width.

    The graphs hold the addresses of the KV cache and of the model's weight tensors: weights must
    be updated in place (``copy_``), as engines do; replacing the tensors needs a new model."""
    sessions = model.__dict__.setdefault("_rlk_graph_sessions", {})
    key = (num_blocks, block_size, width)
    if key not in sessions:
        if len(sessions) >= 2:  # keep memory bounded: drop the oldest session
            sessions.pop(next(iter(sessions)))
        kv = model.new_kv_cache(num_blocks, block_size)  # once: captured graphs hold these addresses
        sessions[key] = (kv, decode_graphs.DecodeGraphs(model, kv, block_size))
    return sessions[key]


def run_rollout(model, requests: list[Request], rc: RolloutConfig, forced: list[list[int]] | None = None,
                probes: bool = False, progress=None) -> RolloutResult:
    """Generates (or, with ``forced``, replays) every request; see the module docstring.

    Every token id, position, slot and page id the executor feeds is built or checked on the host,
    so the steps run under :func:`rlk.kernels.common.host_validated` (no per-launch device reads;
    CUDA graphs are captured there too). ``probes=True`` records per-layer rows and forces the
    eager unpadded path (no CUDA graphs, no decode padding) whatever ``rc`` says.

    Determinism: strict route: each row's bytes are independent of the step's batch composition,
    page placement, chunking, decode padding and CUDA-graph replay (contracts ``attn.v2``,
    ``gemm.bf16.v1``, row ops, ``logp.v2``); sampling is seeded. Native route: none.
    """
    from rlk.kernels.common import host_validated

    check_tokens(model.cfg.vocab_size, [r.prompt for r in requests], forced)
    with host_validated():
        return _run_rollout(model, requests, rc, forced, probes, progress)


def _run_rollout(model, requests: list[Request], rc: RolloutConfig, forced: list[list[int]] | None = None,
                 probes: bool = False, progress=None) -> RolloutResult:
    """The body of :func:`run_rollout` (called under ``host_validated``).

    Determinism: as :func:`run_rollout`.
    """
    cfg, dev = model.cfg, model.device
    bs = rc.block_size
    for r in requests:
        if not r.prompt or r.max_new_tokens < 1:
            raise UnsupportedConfigError("each request needs a prompt and max_new_tokens >= 1")
        if len(r.prompt) + r.max_new_tokens > cfg.max_position_embeddings:
            raise UnsupportedConfigError("prompt + response longer than max_position_embeddings")
    num_blocks = rc.num_blocks or pages_needed(requests, bs) + 1
    free = list(range(num_blocks))
    random.Random(rc.page_seed).shuffle(free)
    jit = random.Random(rc.jitter_seed)
    gen = torch.Generator(device=dev)
    gen.manual_seed(rc.sample_seed)
    budget = rc.token_budget or (rc.max_batch + rc.chunk_size)
    graphs, pad, buckets = decode_mode(rc, dev, probes)
    # Block-table width of every padded decode step: the most pages any request can need.
    width = max(-(-(len(r.prompt) + r.max_new_tokens - 1) // bs) for r in requests)
    if graphs:
        # KV cache and graphs live as long as the model and are reused by later rollouts of the
        # same cache shape and block-table width (an engine captures once, at start-up): stale
        # cache slots are never read (attn.v2 masking: keys at or past kv_len do not reach a
        # product), and every step writes its K/V before reading the cache.
        kv, runner = _graph_session(model, num_blocks, bs, width)
    else:
        kv = model.new_kv_cache(num_blocks, bs)
        runner = None
    captures0, replays0 = (runner.captures, runner.replays) if runner is not None else (0, 0)
    ring = runner.ring if runner is not None else (PinnedRing(dev) if dev.type == "cuda" else None)
    counts = dict(bucket_steps=0, padded_steps=0, over_bucket_steps=0)
    seqs = [_Seq(i, r, forced[i] if forced is not None else None) for i, r in enumerate(requests)]
    waiting = sorted(seqs, key=lambda s: (s.req.arrival_step, s.idx))
    running: list[_Seq] = []
    probe_rows = [dict() for _ in seqs] if probes else None
    step, batch_sizes, step_tokens, changes, prev = 0, [], [], 0, None
    t0 = time.perf_counter()
    while waiting or running:
        while waiting and waiting[0].req.arrival_step <= step and len(running) < rc.max_batch:
            running.append(waiting.pop(0))
        # Schedule: decodes first (one token each), then prefill chunks, within the budget.
        sched, left = [], budget
        for s in running:
            if s.computed >= len(s.prompt) and left > 0 and not (rc.jitter and jit.random() < rc.jitter):
                sched.append((s, 1))
                left -= 1
        for s in running:
            if s.computed < len(s.prompt) and left > 0 and not (rc.jitter and jit.random() < rc.jitter):
                n = min(rc.chunk_size, len(s.prompt) - s.computed, left)
                sched.append((s, n))
                left -= n
        if not sched:
            step += 1
            if step > 10_000_000:
                raise RuntimeError("rollout scheduler made no progress")
            continue
        ids, pos, slots, cu, lens = [], [], [], [0], []
        for s, n in sched:
            toks = s.tokens
            for p in range(s.computed, s.computed + n):
                if p // bs >= len(s.pages):
                    if not free:
                        raise UnsupportedConfigError(f"KV cache of {num_blocks} blocks exhausted")
                    s.pages.append(free.pop(0))
                ids.append(toks[p])
                pos.append(p)
                slots.append(s.pages[p // bs] * bs + p % bs)
            cu.append(cu[-1] + n)
            lens.append(s.computed + n)
        bucket = None
        if pad and all(n == 1 for _, n in sched):
            bucket = next((p for p in buckets if p >= len(sched)), None)
            counts["over_bucket_steps" if bucket is None else "bucket_steps"] += 1
        pr = {} if probes else None
        step_lp = tg = None
        if bucket is not None:
            # Padded step of one-token rows; rows >= len(sched) are padding and never read below.
            # When every row samples (decodes, or a prompt's last token; a one-token prefill
            # chunk that leaves its prompt unfinished does not), rows 0..B-1 are exactly the
            # samplers in order, so with forced tokens the step can give their logp itself.
            counts["padded_steps"] += bucket > len(sched)
            every_row_samples = all(s.computed + 1 >= len(s.prompt) for s, _ in sched)
            tg = ([s.forced[len(s.generated)] for s, _ in sched]
                  if (rc.step_logp and forced is not None and every_row_samples) else None)
            host = decode_graphs.pad_decode_inputs(ids, pos, slots, lens, [s.pages for s, _ in sched], bucket, width,
                                                   targets=tg)
            if runner is not None:
                hidden, step_lp = runner.step(host)
            else:
                hidden = model.rollout_step(host.ids.to(dev), host.positions.to(dev), kv, host.meta(dev, bs))
                if tg is not None:
                    step_lp = model.logp(hidden, host.targets.to(dev))
        else:
            nb = max(len(s.pages) for s, _ in sched)
            bt = torch.zeros(len(sched), nb, dtype=torch.int32)
            for b, (s, _) in enumerate(sched):
                bt[b, : len(s.pages)] = torch.tensor(s.pages, dtype=torch.int32)
            meta = PagedMeta(
                block_tables=bt.to(dev), cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
                seq_lens_kv=torch.tensor(lens, dtype=torch.int32, device=dev),
                slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev), block_size=bs,
                max_seqlen_q=max(n for _, n in sched), host_cu=list(cu), host_lens=list(lens))
            hidden = model.rollout_step(torch.tensor(ids, dtype=torch.int64, device=dev),
                                        torch.tensor(pos, dtype=torch.int64, device=dev), kv, meta, pr)
        if probes:
            _scatter_probes(pr, sched, cu, probe_rows)
        # Rows that sample: the last row of each request whose prompt is complete after this step.
        samplers = [(b, s) for b, (s, n) in enumerate(sched) if s.computed + n >= len(s.prompt)]
        for s, n in sched:
            s.computed += n
        if samplers and step_lp is not None:
            # Every row samples (checked above): rows 0..B-1 in order; a copy: the graph's output
            # is overwritten by the next replay.
            assert len(samplers) == len(sched)
            host_toks = tg  # the forced tokens the step scored, rows in order
            lp = step_lp[: len(samplers)].clone()
        elif samplers:
            row_ids = [cu[b + 1] - 1 for b, _ in samplers]
            if forced is not None:
                # Frozen tokens are known on the host: no device read this step, and the inputs
                # go through pinned memory, so the host can queue the next step meanwhile.
                host_toks = [s.forced[len(s.generated)] for _, s in samplers]
                rows, toks = _to_device(ring, dev, torch.tensor(row_ids, dtype=torch.int64),
                                        torch.tensor(host_toks, dtype=torch.int64))
            else:
                rows = torch.tensor(row_ids, device=dev)
            h = hidden.index_select(0, rows).contiguous()
            if forced is None:
                # One LM-head pass: the logits sample, and the same pass's statistics give the
                # sampled tokens' logp (strict: x_target - lse of logp.v2, the bytes linear_logp
                # returns; native: log_softmax of the same logits).
                logits, stats = model.logits_for_sampling(h)
                q = torch.empty_like(logits).exponential_(generator=gen)
                toks = (torch.softmax(logits, dim=-1) / q).argmax(dim=-1)
                lp = model.logp_of_sampled(logits, stats, toks)
                ent = row_entropy(logits)  # a statistic of the fixture (never compared bitwise)
                host_toks = toks.tolist()  # the step's one device read (sampling only)
            else:
                lp = model.logp(h, toks)
        if samplers:
            for j, ((_, s), t) in enumerate(zip(samplers, host_toks)):
                s.generated.append(int(t))
                s.logp.append(lp[j])
                if forced is None:
                    s.entropy.append(ent[j])
        comp = frozenset(s.idx for s, _ in sched)
        changes += prev is not None and comp != prev
        prev = comp
        batch_sizes.append(len(sched))
        step_tokens.append(cu[-1])
        for s in [s for s in running if s.done()]:
            running.remove(s)
            free.extend(s.pages)
        step += 1
        if progress and len(batch_sizes) % 100 == 0:
            progress(f"rollout step {len(batch_sizes)}: running {len(running)}, waiting {len(waiting)}")
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return RolloutResult(
        responses=[s.generated for s in seqs],
        logp=[torch.stack(s.logp) for s in seqs],
        entropy=[torch.stack(s.entropy) for s in seqs] if forced is None else None,
        page_tables=[s.pages for s in seqs],
        steps=len(batch_sizes), batch_sizes=batch_sizes, step_tokens=step_tokens,
        composition_changes=changes, seconds=time.perf_counter() - t0,
        probes=[{k: torch.stack([r[k][p] for p in sorted(r[k])]) for k in r} for r in probe_rows] if probes else None,
        graph_captures=runner.captures - captures0 if runner else 0,
        graph_replays=runner.replays - replays0 if runner else 0, **counts,
    )


def _to_device(ring, dev, *arrays):
    """CPU arrays on ``dev``: one non-blocking pinned copy on CUDA, plain copies elsewhere."""
    if ring is None:
        return [a.to(dev) for a in arrays]
    return ring.to_device(*arrays)


def _scatter_probes(pr, sched, cu, probe_rows):
    """Maps probe rows of one step to (request, position); keys ``attn_out.L``, ``mlp_out.L``, ``final``."""
    flat = {}
    for name, val in pr.items():
        if isinstance(val, list):
            for li, t in enumerate(val):
                flat[f"{name}.{li}"] = t
        else:
            flat[name] = val
    for b, (s, n) in enumerate(sched):
        for i in range(n):
            p = s.computed + i
            for k, t in flat.items():
                probe_rows[s.idx].setdefault(k, {})[p] = t[cu[b] + i].cpu()
