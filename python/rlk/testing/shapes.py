"""Shared shape catalog: named, tagged cases for tests and benchmarks.

Tags: ``cpu`` (small enough for the Triton interpreter in CI), ``gpu`` (real Qwen3 sizes),
``awkward`` (primes, 1, 63, 255, 257), ``decode`` / ``prefill``, ``tp4``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable


@dataclasses.dataclass(frozen=True)
class Shape:
    id: str
    op: str
    dims: dict
    tags: frozenset

    def __getitem__(self, k: str) -> Any:
        return self.dims[k]


def _s(id, op, tags, **dims):
    return Shape(id=id, op=op, dims=dims, tags=frozenset(tags))


# Row counts that straddle block boundaries (16/32/64/128) and awkward sizes.
CPU_ROWS = (1, 2, 3, 7, 16, 17, 31, 33, 63)
GPU_ROWS = (1, 2, 3, 8, 31, 32, 33, 64, 127, 128, 255, 256, 1000, 2048, 8192)

# Qwen3-8B projections (K x N) as in PERF.md, full and TP4 shards.
QWEN3_8B_GEMMS = {
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 24576),
    "down": (12288, 4096),
    "tp4_qkv": (4096, 1536),
    "tp4_o": (1024, 4096),
    "tp4_gate_up": (4096, 6144),
    "tp4_down": (3072, 4096),
    "tp4_lm_head": (4096, 37984),
}



def _qwen3_projections(hidden: int, inter: int, heads: int, kv_heads: int = 8, head_dim: int = 128) -> dict:
    """(K, N) of a dense Qwen3's four projections at TP1 (fused qkv and gate_up as engines run them)."""
    return {"qkv": (hidden, (heads + 2 * kv_heads) * head_dim), "o": (heads * head_dim, hidden),
            "gate_up": (hidden, 2 * inter), "down": (inter, hidden)}


# The other dense Qwen3 sizes' projections (hidden, intermediate, query heads from the published
# Hugging Face config.json files; 8 KV heads and head_dim 128 in all). Not in any tuned table
# entry: the GEMM table's default rule serves them ("tune" sizes fit the rule, "holdout" sizes
# only evaluate it).
QWEN3_SIZES = {"0.6b": (1024, 3072, 16), "1.7b": (2048, 6144, 16), "4b": (2560, 9728, 32),
               "14b": (5120, 17408, 40), "32b": (5120, 25600, 64)}
QWEN3_RULE_TUNE_SIZES = ("0.6b", "4b", "32b")
QWEN3_RULE_HOLDOUT_SIZES = ("1.7b", "14b")
QWEN3_OTHER_GEMMS = {f"{size}_{proj}": kn for size, dims in QWEN3_SIZES.items()
                     for proj, kn in _qwen3_projections(*dims).items()}

SHAPES: tuple[Shape, ...] = (
    # GEMM, CPU interpreter sizes (K multiple of the 64 chunk; N awkward).
    _s("gemm-cpu-k128-n96", "gemm", {"cpu"}, K=128, N=96),
    _s("gemm-cpu-k64-n257", "gemm", {"cpu", "awkward"}, K=64, N=257),
    _s("gemm-cpu-k192-n63", "gemm", {"cpu", "awkward"}, K=192, N=63),
    *(_s(f"gemm-q8b-{n}", "gemm", {"gpu"} | ({"tp4"} if n.startswith("tp4") else set()), K=k, N=nn)
      for n, (k, nn) in QWEN3_8B_GEMMS.items()),
    # Row ops.
    _s("rowops-cpu-h64", "rowops", {"cpu"}, hidden=64, head_dim=16, n_q=4, n_kv=2, ffn=96),
    _s("rowops-cpu-h80", "rowops", {"cpu", "awkward"}, hidden=80, head_dim=32, n_q=2, n_kv=1, ffn=112),
    _s("rowops-q8b", "rowops", {"gpu"}, hidden=4096, head_dim=128, n_q=32, n_kv=8, ffn=12288),
    # Attention.
    _s("attn-cpu-d64", "attention", {"cpu"}, n_q=4, n_kv=2, head_dim=64),
    _s("attn-cpu-d16", "attention", {"cpu"}, n_q=2, n_kv=1, head_dim=16),
    _s("attn-q8b", "attention", {"gpu", "prefill", "decode"}, n_q=32, n_kv=8, head_dim=128),
    _s("attn-q8b-tp4", "attention", {"gpu", "tp4", "prefill", "decode"}, n_q=8, n_kv=2, head_dim=128),
    # Linear logp.
    _s("logp-cpu", "linear_logp", {"cpu", "awkward"}, H=64, V=257),
    _s("logp-tp4", "linear_logp", {"gpu", "tp4"}, H=4096, V=37984),
    _s("logp-tp1", "linear_logp", {"gpu"}, H=4096, V=151936),
)


def cases(op: str, *tags: str) -> list[Shape]:
    """Shapes of ``op`` having every tag in ``tags``."""
    want = set(tags)
    return [s for s in SHAPES if s.op == op and want <= s.tags]


def ids(shapes: Iterable[Shape]) -> list[str]:
    return [s.id for s in shapes]
