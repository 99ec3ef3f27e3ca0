"""Weight sync from the trainer into the rollout engine, checked by a fingerprint on both sides.

The sender fingerprints the weights it sends (sha256 over every tensor's name, dtype and bytes,
:func:`rlk.models.qwen3.weights.weights_sha256`); the transport copies them into the engine's
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


def fingerprint(weights: dict[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes and raw bytes, names sorted (the same on both sides)."""
    return weights_sha256(weights)


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
                 transport: Callable[[dict, dict], None] | None = None) -> dict:
    """Sends trainer weights ``src`` into ``engine.w`` and checks the fingerprint on both sides.

    Args:
      src: the trainer's weights in the engine's layout (fused names, same dtypes and shapes).
      engine: the rollout side (``.w``: its weight dict; ``.weight_generation`` is set here).
      generation: the trainer's weight generation (optimizer steps taken).
      transport: ``transport(src, engine.w)`` moves the bytes (default :func:`copy_transport`).
    Returns:
      ``{"generation", "sha256_trainer", "sha256_rollout", "match": True, "bytes", "seconds"}``.
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
    sent = fingerprint(src)  # sender side, before the bytes move
    (transport or copy_transport)(src, dst)
    held = fingerprint(dst)  # receiver side, over its own tensors
    if held != sent:
        engine.weight_generation = None  # the engine holds no generation the trainer sent
        diag = diagnose(src, dst)
        raise WeightSyncError(f"weight sync of generation {generation}: fingerprint mismatch: trainer sent "
                              f"{sent[:16]}, rollout holds {held[:16]}; differing tensors: {diag}")
    engine.weight_generation = generation
    return {"generation": generation, "sha256_trainer": sent, "sha256_rollout": held, "match": True,
            "bytes": int(sum(t.numel() * t.element_size() for t in src.values())),
            "seconds": time.perf_counter() - t0}


def check_generation(engine, expected: int) -> None:
    """Raises :class:`WeightSyncError` unless ``engine`` holds weight generation ``expected``."""
    held = getattr(engine, "weight_generation", None)
    if held != expected:
        raise WeightSyncError(f"rollout engine holds weight generation {held}, the trainer's latest is {expected} "
                              "(stale or unverified weights: the rollout would be off-policy)")
