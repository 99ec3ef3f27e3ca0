"""Weight sync from the trainer into the rollout engine, checked by a fingerprint on both sides.

The sender fingerprints the weights it sends (``sha256`` over every tensor's name, dtype and
bytes, :func:`rlk.models.qwen3.weights.weights_sha256`, on the host; or ``device``: an exact
integer fingerprint computed on the GPU, :func:`device_fingerprint`, for models whose bytes are
too many to hash on the host every step); the transport copies them into the engine's
own tensors in place (``copy_``, as engines load weights: captured CUDA graphs keep their
addresses); the receiver fingerprints what its tensors now hold. Different digests abort the run
with :class:`WeightSyncError`, whose message names the tensors that differ (per-tensor digests,
count of differing elements, first differing index). The engine records the generation it holds,
and the loop refuses to roll out with a generation the trainer did not send last (stale weights).
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable

import torch

from rlk.errors import ProvenanceError, UnsupportedConfigError
from rlk.models.qwen3.weights import weights_sha256


class WeightSyncError(ProvenanceError):
    """The rollout engine's weights are not the ones the trainer sent (fingerprint mismatch), or
    the engine holds another weight generation than the trainer's latest."""


FINGERPRINTS = ("sha256", "device")

# The device fingerprint's arithmetic: 16-bit words u_i (0..65535) of a tensor's bytes, and per
# lane L the sum over i of u_i * m_L(i) modulo the prime P = 2**31 - 1, with position
# multipliers m_L(i) = 1 + (A_L * i + B_L) mod (P - 1), never 0 mod P. Integer sums modulo P are
# exact in any order, so the digest does not depend on the chunking, the device or the kernel's
# reduction tree. A change of one word always changes every lane (a nonzero difference below P
# times a nonzero multiplier, modulo a prime); two lanes with unrelated multipliers leave
# multi-word coincidences at about 2**-62. Not cryptographic: it checks a copy, it does not
# authenticate one.
_P = 2 ** 31 - 1
_LANES = ((1_013_904_223, 12_345), (914_159_265, 271_828_182))  # A_L < 2**30
_CHUNK_WORDS = 1 << 25  # int64 temporaries of 256 MiB per lane


def _device_lanes(t: torch.Tensor) -> list[int]:
    flat = t.detach().contiguous().view(-1)
    b = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
    if b.numel() % 2:
        b = torch.cat([b, b.new_zeros(1)])
    words = b.view(torch.int16)
    if words.numel() >= 2 ** 33:
        raise UnsupportedConfigError(f"device fingerprint: {words.numel()} words exceed 2**33 (int64 products)")
    acc = [torch.zeros((), dtype=torch.int64, device=t.device) for _ in _LANES]
    for s in range(0, words.numel(), _CHUNK_WORDS):
        u = words[s:s + _CHUNK_WORDS].to(torch.int64) & 0xFFFF
        i = torch.arange(s, s + u.numel(), dtype=torch.int64, device=t.device)
        for k, (a, c) in enumerate(_LANES):
            m = (i * a + c) % (_P - 1) + 1  # i < 2**33 and a < 2**30: no int64 overflow
            acc[k] = (acc[k] + ((u * m) % _P).sum()) % _P  # chunk sums < 2**56
    return [int(x) for x in acc]


def tensor_fingerprint(t: torch.Tensor) -> str:
    """One tensor's exact fingerprint, computed where it lives: ``dtype|shape|[lane0, lane1]``
    (the arithmetic above)."""
    return f"{t.dtype}|{tuple(t.shape)}|{_device_lanes(t)}"


def device_fingerprint(weights: dict[str, torch.Tensor]) -> str:
    """An exact integer fingerprint computed where the tensors live (no copy to the host): per
    tensor (names sorted) its name, dtype, shape and the two lane sums of the arithmetic above,
    hashed together with sha256 on the host. For weights too large to hash on the host each
    step (a Qwen3-8B model is 16 GB)."""
    h = hashlib.sha256(b"rlk.device_fingerprint.v1")
    for k in sorted(weights):
        h.update(f"{k}|{tensor_fingerprint(weights[k])}".encode())
    return h.hexdigest()


def fingerprint(weights: dict[str, torch.Tensor], kind: str = "sha256") -> str:
    """The weights' digest, the same function on both sides: ``"sha256"`` over names, dtypes and
    raw bytes, names sorted (copies to the host); ``"device"``: :func:`device_fingerprint`."""
    if kind == "sha256":
        return weights_sha256(weights)
    if kind == "device":
        return device_fingerprint(weights)
    raise UnsupportedConfigError(f"fingerprint kind {kind!r} unknown (known: {', '.join(FINGERPRINTS)})")


def _tensor_sha(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def copy_transport(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> None:
    """The default transport: in-place copies into the engine's tensors (same names, shapes, dtypes)."""
    for k in sorted(src):
        dst[k].copy_(src[k])


def diagnose(sent: dict[str, torch.Tensor], held: dict[str, torch.Tensor], limit: int = 5) -> list[dict]:
    """Per tensor that differs between ``sent`` and ``held`` (at most ``limit``): name, both
    digests, differing elements and the first differing flat index."""
    out = []
    for k in sorted(set(sent) | set(held)):
        if k not in sent or k not in held:
            out.append({"tensor": k, "problem": "only on the " + ("rollout" if k in held else "trainer") + " side"})
        else:
            a, b = sent[k].detach().cpu(), held[k].detach().cpu()
            if a.shape != b.shape or a.dtype != b.dtype:
                out.append({"tensor": k, "problem": f"{tuple(a.shape)} {a.dtype} sent, {tuple(b.shape)} {b.dtype} held"})
                continue
            av, bv = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
            if torch.equal(av, bv):
                continue
            # Element i differs when any of its bytes does (bitwise: -0.0 vs 0.0 and NaN payloads count).
            neq = (av.reshape(-1, a.element_size()) != bv.reshape(-1, a.element_size())).any(dim=1)
            idx = torch.nonzero(neq)
            out.append({"tensor": k, "sha256_sent": _tensor_sha(a), "sha256_held": _tensor_sha(b),
                        "differing_elements": int(neq.sum()),
                        "first_index": int(idx[0]) if idx.numel() else None,
                        "values": [float(a.flatten()[int(idx[0])]), float(b.flatten()[int(idx[0])])]
                        if idx.numel() and a.is_floating_point() else None})
        if len(out) >= limit:
            break
    return out


def sync_weights(src: dict[str, torch.Tensor], engine, generation: int,
                 transport: Callable[[dict, dict], None] | None = None, kind: str = "sha256") -> dict:
    """Sends trainer weights ``src`` into ``engine.w`` and checks the fingerprint on both sides.

    Args:
      src: the trainer's weights in the engine's layout (fused names, same dtypes and shapes).
      engine: the rollout side (``.w``: its weight dict; ``.weight_generation`` is set here).
      generation: the trainer's weight generation (optimizer steps taken).
      transport: ``transport(src, engine.w)`` moves the bytes (default :func:`copy_transport`).
      kind: the fingerprint (:func:`fingerprint`), computed on both sides.
    Returns:
      ``{"generation", "fingerprint": kind, "sha256_trainer", "sha256_rollout", "match": True,
      "bytes", "seconds"}`` (the two digests under the ``sha256_*`` keys whatever the kind: both
      are sha256 hex strings).
    Raises:
      WeightSyncError: the digests differ (the message carries :func:`diagnose`'s findings).
      UnsupportedConfigError: the two sides have different tensor names, shapes or dtypes.
    """
    t0 = time.perf_counter()
    dst = engine.w
    if set(src) != set(dst):
        raise UnsupportedConfigError(f"weight sync: names differ: trainer only {sorted(set(src) - set(dst))[:3]}, "
                                     f"rollout only {sorted(set(dst) - set(src))[:3]}")
    for k in src:
        if src[k].shape != dst[k].shape or src[k].dtype != dst[k].dtype:
            raise UnsupportedConfigError(f"weight sync: {k}: trainer {tuple(src[k].shape)} {src[k].dtype}, "
                                         f"rollout {tuple(dst[k].shape)} {dst[k].dtype}")
    sent = fingerprint(src, kind)  # sender side, before the bytes move
    (transport or copy_transport)(src, dst)
    held = fingerprint(dst, kind)  # receiver side, over its own tensors
    if held != sent:
        engine.weight_generation = None  # the engine holds no generation the trainer sent
        diag = diagnose(src, dst)
        raise WeightSyncError(f"weight sync of generation {generation}: fingerprint mismatch: trainer sent "
                              f"{sent[:16]}, rollout holds {held[:16]}; differing tensors: {diag}")
    engine.weight_generation = generation
    return {"generation": generation, "fingerprint": kind, "sha256_trainer": sent, "sha256_rollout": held, "match": True,
            "bytes": int(sum(t.numel() * t.element_size() for t in src.values())),
            "seconds": time.perf_counter() - t0}


def sync_remote(src: dict[str, torch.Tensor], engine, generation: int, kind: str = "sha256") -> dict:
    """Sends trainer weights ``src`` to an engine whose weights live elsewhere (another process:
    a vLLM worker) and checks the fingerprint on both sides.

    ``engine.receive(src, generation, kind)`` moves the bytes by its own transport and returns
    the fingerprint (:func:`fingerprint`, ``kind``) the receiving side computed over the weights
    it now holds, under the same names as ``src``. Returns and raises as :func:`sync_weights`
    (no per-tensor diagnosis: the receiver's tensors are not in this process)."""
    t0 = time.perf_counter()
    sent = fingerprint(src, kind)  # sender side, before the bytes move
    engine.weight_generation = None  # until the receiver's fingerprint matches
    held = engine.receive(src, generation, kind)
    if held != sent:
        raise WeightSyncError(f"weight sync of generation {generation}: fingerprint mismatch: trainer sent "
                              f"{sent}, rollout holds {held}")
    engine.weight_generation = generation
    return {"generation": generation, "fingerprint": kind, "sha256_trainer": sent, "sha256_rollout": held, "match": True,
            "bytes": int(sum(t.numel() * t.element_size() for t in {id(t): t for t in src.values()}.values())),
            "seconds": time.perf_counter() - t0}


def check_generation(engine, expected: int) -> None:
    """Raises :class:`WeightSyncError` unless ``engine`` holds weight generation ``expected``."""
    held = getattr(engine, "weight_generation", None)
    if held != expected:
        raise WeightSyncError(f"rollout engine holds weight generation {held}, the trainer's latest is {expected} "
                              "(stale or unverified weights: the rollout would be off-policy)")
