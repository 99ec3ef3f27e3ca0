"""Multi-process scenarios for the collectives (run by ``rlk.collectives.harness``).

Every rank builds the inputs of *all* ranks from fixed seeds, so it can compute the
single-process reference (``rlk.collectives.reference``) itself and compare bitwise; the parent
compares the per-rank output hashes across ranks.
"""

from __future__ import annotations

import hashlib
import time

import torch

from rlk import collectives as C
from rlk.collectives import reference
from rlk.testing import assert_bitwise_equal

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def order_sensitive_input(seed: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Values spread over ~2**40 of magnitude, so a different rank order changes the sum."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(numel, generator=g, dtype=torch.float32)
    e = torch.randint(-20, 21, (numel,), generator=g).to(torch.float32)
    return (x * torch.exp2(e)).to(dtype)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def collectives_bitwise(rank: int, world: int, params: dict) -> dict:
    """all_reduce / reduce_scatter / all_gather vs the reference for each (dtype, numel).

    params: ``cases`` ([dtype name, numel] pairs) or ``sizes`` (each with bf16 and fp32).
    """
    seed = int(params.get("seed", 0))
    rows, order_sensitive = [], 0
    cases = params.get("cases") or [[d, n] for d in ("bf16", "fp32") for n in params["sizes"]]
    for dname, numel in cases:
        dtype = _DTYPES[dname]
        inputs = [order_sensitive_input(seed, r, numel, dtype) for r in range(world)]
        mine = inputs[rank]
        ar = C.all_reduce(mine)
        ref = reference.fixed_order_sum(inputs)
        assert_bitwise_equal(ar, ref, f"all_reduce {dname} n={numel} rank {rank}")
        rev = reference.fixed_order_sum(inputs[::-1])
        order_sensitive += int(not torch.equal(ref.view(-1).view(torch.uint8), rev.view(-1).view(torch.uint8)))
        # reduce-scatter: pad the input to a multiple of the world size.
        m = -(-numel // world)
        padded = [torch.cat([x, x.new_zeros(m * world - numel)]) for x in inputs]
        rs = C.reduce_scatter(padded[rank])
        assert_bitwise_equal(rs, reference.reduce_scatter(padded)[rank], f"reduce_scatter {dname} n={numel}")
        if params.get("with_out_dtype") and dtype == torch.float32:
            ar16 = C.all_reduce(mine, out_dtype=torch.bfloat16)
            assert_bitwise_equal(ar16, reference.fixed_order_sum(inputs, torch.bfloat16), "fp32->bf16 all_reduce")
        ag = C.all_gather(mine.view(numel, 1))
        assert_bitwise_equal(ag, reference.all_gather([x.view(numel, 1) for x in inputs]), "all_gather")
        rows.append({"dtype": dname, "numel": numel, "ar": digest(ar), "rs_full": digest(ar[: m * world])
                     if numel == m * world else None, "ag": digest(ag)})
    out = {"rows": rows, "order_sensitive_cases": order_sensitive}
    if params.get("merge"):  # one spawn for several checks: process start-up dominates on CPU
        out["merge"] = merge_stats(rank, world, params)
    return out


def missing_rank(rank: int, world: int, params: dict) -> dict:
    """The last rank never calls the collective (it sleeps, then leaves)."""
    sg = C.StrictGroup(diag_timeout_s=float(params.get("diag_timeout_s", 2.0)))
    x = torch.ones(16)
    C.all_reduce(x, sg)  # everyone arrives once
    if rank == world - 1:
        time.sleep(float(params.get("sleep_s", 8.0)))
        return {"skipped": True}
    t0 = time.monotonic()
    try:
        C.all_reduce(x, sg)
    except C.RankTimeoutError as e:
        return {"raised": "RankTimeoutError", "message": str(e), "after_s": time.monotonic() - t0}
    return {"raised": None}


def contract_mismatch(rank: int, world: int, params: dict) -> dict:
    """Rank 1 claims another all-reduce contract ID."""
    from rlk.collectives.contracts import COLLECTIVE_CONTRACT_IDS

    ids = dict(COLLECTIVE_CONTRACT_IDS)
    if rank == 1:
        ids["ar"] = "ar.v2"
    sg = C.StrictGroup(contract_ids=ids)
    from rlk.errors import ContractMismatchError

    try:
        C.all_reduce(torch.ones(8), sg)
    except ContractMismatchError as e:
        return {"raised": "ContractMismatchError", "message": str(e)}
    return {"raised": None}


def stale_generation(rank: int, world: int, params: dict) -> dict:
    """Rank 1's generation counter runs one ahead (as if it had repeated a call)."""
    sg = C.StrictGroup()
    C.all_reduce(torch.ones(8), sg)
    if rank == 1:
        sg.generation += 1
    try:
        C.all_reduce(torch.ones(8), sg)
    except C.StaleGenerationError as e:
        return {"raised": "StaleGenerationError", "message": str(e)}
    return {"raised": None}


def op_mismatch(rank: int, world: int, params: dict) -> dict:
    """Same byte count, different call: rank 0 reduces 8 fp32, the others 16 bf16."""
    x = torch.ones(8) if rank == 0 else torch.ones(16, dtype=torch.bfloat16)
    try:
        C.all_reduce(x)
    except C.CollectiveError as e:
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None}


def merge_stats(rank: int, world: int, params: dict) -> dict:
    """Vocab-parallel (max, sumexp) merge equals the single-process merge over all shards."""
    T, V = 5, 7
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(T, V * world, generator=g) * 4
    shards = logits.chunk(world, dim=1)
    stats = [(s.max(dim=1).values, torch.exp(s - s.max(dim=1, keepdim=True).values).sum(dim=1)) for s in shards]
    m, s = C.merge_logsumexp_stats(stats[rank], merge_fn=reference.merge_max_sumexp)
    rm, rsum = reference.merge_max_sumexp(stats)
    assert_bitwise_equal(m, rm, "merged max")
    assert_bitwise_equal(s, rsum, "merged sumexp")
    return {"m": digest(m), "s": digest(s)}
