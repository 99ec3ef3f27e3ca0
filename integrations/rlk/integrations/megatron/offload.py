"""megatron's optimizer offload for the megatron actor (``optimizer_offload``).

With ``optimizer_offload`` (megatron's ``HybridDeviceOptimizer``, built by
:func:`rlk.integrations.megatron.actor.training_wrappers`) the fp32 main parameters and both Adam moments live on the host and
Adam runs there; the device keeps the bf16 parameters and the fp32 ``main_grad`` buffer. The
gradients are those without offload (the backward does not see the optimizer); the update of an
offloaded parameter is torch's CPU AdamW, bitwise the device-resident update on the CPU but not on
a GPU, whose AdamW kernels round differently (``_HOST_ADAM_FUSED`` has the measurement).
On the CPU the offloaded step runs through
:func:`rlk.integrations.megatron.host_emulation.cuda_names_on_cpu` (``placement=True``).
"""

from __future__ import annotations

from typing import Union

import torch

from rlk.errors import UnsupportedConfigError
from rlk.integrations.megatron.host_emulation import cuda_names_on_cpu

# torch's AdamW kernel choice under offload. megatron puts ``fused=True`` in the hybrid optimizer's
# parameter groups, which every sub-optimizer reads, the device one included; None leaves the choice
# to torch as without offload (foreach on CUDA tensors, single-tensor on CPU ones; an explicit False
# would pick single-tensor on CUDA too, whose bits differ from foreach). So the part kept on the
# device runs the kernel the optimizer without offload runs, and the host part torch's single-tensor
# AdamW, the same op sequence (lerp, mul + addcmul, sqrt, div, add, addcdiv) on CPU tensors: on the
# CPU bitwise the update without offload (actor_offload_test). No CPU AdamW gives a GPU's bits:
# against CUDA's default AdamW on the same fp32 data (torch 2.11, H100), torch's unfused and fused
# CPU AdamW both differ in ~34% of exp_avg_sq after one step ((1 - beta2) * g * g rounds in another
# order) and in 0.2% (lr 1e-5, one step) to ~48% (lr 1e-2, three steps) of the fp32 main
# parameters; CUDA's fused AdamW differs in every moment. So on a GPU an offloaded parameter's
# update is not bitwise the one without offload (the tiny actor, 2 steps on an H100: gradients,
# logp and bf16 weights equal, 37 to 19056 of 106880 fp32 main parameters and ~23% of exp_avg_sq
# differ; offloading half, the device-resident half's main parameters equal); it is deterministic
# run to run (elementwise CPU kernels on a fixed thread count).
_HOST_ADAM_FUSED = None


def offload_fraction(optimizer_offload: Union[bool, float]) -> float:
    """The fraction of the parameters whose optimizer state megatron's ``HybridDeviceOptimizer``
    keeps on the host: False/0 -> 0.0 (no offload), True -> 1.0 (all), a float in (0, 1] as is."""
    if isinstance(optimizer_offload, bool):
        return 1.0 if optimizer_offload else 0.0
    f = float(optimizer_offload)
    if not 0.0 <= f <= 1.0:
        raise UnsupportedConfigError(f"optimizer_offload={optimizer_offload!r}: a bool or a fraction in [0, 1]")
    return f


def check_offload(optimizer_offload: Union[bool, float], *, optimizer: bool, distributed_optimizer: bool) -> float:
    """The offload fraction (:func:`offload_fraction`), refusing what megatron's offload cannot
    give here."""
    fraction = offload_fraction(optimizer_offload)
    if fraction > 0 and not optimizer:
        raise UnsupportedConfigError("optimizer_offload needs an optimizer (optimizer=False builds none)")
    if fraction > 0 and not distributed_optimizer:
        raise UnsupportedConfigError(
            "optimizer_offload needs distributed_optimizer=True: megatron's offload keeps no fp32 main parameter "
            "on the device only through its precision-aware path (use_precision_aware_optimizer), which requires "
            "the DistributedOptimizer")
    return fraction


def inner_optimizers(opt) -> list:
    """The megatron optimizers ``opt`` chains (``get_megatron_optimizer`` may return a
    ``ChainedOptimizer`` of one), or ``[opt]``."""
    return list(getattr(opt, "chained_optimizers", None) or [opt])


def hybrid_optimizer(opt):
    """megatron's ``HybridDeviceOptimizer`` inside ``opt`` (a megatron optimizer built by
    :func:`training_wrappers` with ``optimizer_offload``), or None without offload."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    found = [o.optimizer for o in inner_optimizers(opt) if isinstance(getattr(o, "optimizer", None),
                                                                       HybridDeviceOptimizer)]
    if len(found) > 1:
        raise UnsupportedConfigError(f"{len(found)} HybridDeviceOptimizers (one parameter group type expected)")
    return found[0] if found else None


def _configure_offload(opt, fraction: float) -> None:
    """Checks what megatron built for ``optimizer_offload`` (fails closed on anything else: a
    megatron version that places the states differently) and sets torch's AdamW kernel choice
    (``_HOST_ADAM_FUSED``). Every sub-optimizer takes its options from the hybrid optimizer's
    parameter groups at each step, so the option is set there."""
    hdo = hybrid_optimizer(opt)
    if hdo is None:
        raise UnsupportedConfigError("optimizer_offload: megatron built no HybridDeviceOptimizer "
                                     f"({[type(o).__name__ for o in inner_optimizers(opt)]})")
    for o in inner_optimizers(opt):
        masters = [p for g in getattr(o, "shard_fp32_from_float16_groups", []) for p in g if p is not None]
        if masters:
            raise UnsupportedConfigError(f"optimizer_offload: {type(o).__name__} keeps {len(masters)} fp32 main "
                                         "parameters on the device (megatron's precision-aware path keeps none)")
    params = [p for g in hdo.param_groups for p in g["params"]]
    offloaded = len(hdo.gpu_params_map_cpu_copy)
    if fraction >= 1.0 and (offloaded != len(params) or hdo.gpu_optimizer is not None):
        raise UnsupportedConfigError(f"optimizer_offload=1.0: {offloaded} of {len(params)} parameters offloaded")
    if offloaded == 0:
        raise UnsupportedConfigError(f"optimizer_offload={fraction}: no parameter offloaded")
    for g in hdo.param_groups:
        g["fused"] = _HOST_ADAM_FUSED
    for sub in hdo.sub_optimizers:
        for g in sub.param_groups:
            g["fused"] = _HOST_ADAM_FUSED
    hdo.defaults["fused"] = _HOST_ADAM_FUSED
    if torch.cuda.is_available():
        # HybridDeviceOptimizer copies each parameter through page-locked memory once; torch's host
        # allocator keeps those blocks (sizes rounded up to a power of two) until asked to let go.
        empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) or \
            getattr(torch._C, "_host_emptyCache", None)
        if empty is not None:
            empty()


def optimizer_placement(opt) -> dict:
    """Where ``opt``'s fp32 main parameters and Adam moments live, and the bytes on each side
    (moments counted once a step has created them); for reports."""
    if opt is None:
        return {"optimizer": None}
    hdo = hybrid_optimizer(opt)
    names = [type(o).__name__ for o in inner_optimizers(opt)]
    if hdo is None:
        inner = [type(getattr(o, "optimizer", None)).__name__ for o in inner_optimizers(opt)]
        return {"optimizer": names, "inner": inner, "offload_fraction": 0.0, "main_params": "device",
                "adam_states": "device"}
    host, dev = 0, 0
    for sub in hdo.sub_optimizers:
        for g in sub.param_groups:
            for p in g["params"]:
                # The hybrid optimizer also files each main parameter under "master_param".
                n = p.numel() * p.element_size() + sum(
                    v.numel() * v.element_size() for v in sub.state.get(p, {}).values()
                    if isinstance(v, torch.Tensor) and v.dim() > 0 and v is not p)
                on_host = sub is not hdo.gpu_optimizer
                host, dev = (host + n, dev) if on_host else (host, dev + n)
    staged = sum(t.numel() * t.element_size() for t in hdo.cpu_copy_map_grad.values())
    return {"optimizer": names, "inner": "megatron HybridDeviceOptimizer", "offload_fraction": hdo.offload_fraction,
            "main_params": "host" if hdo.gpu_optimizer is None else "host and device",
            "adam_states": "host" if hdo.gpu_optimizer is None else "host and device",
            "host_adam": "torch.optim.AdamW, " + (
                "torch's default kernel" if _HOST_ADAM_FUSED is None else f"fused={_HOST_ADAM_FUSED}"),
            "offloaded_tensors": len(hdo.gpu_params_map_cpu_copy),
            "tensors": sum(len(g["params"]) for g in hdo.param_groups),
            "host_state_bytes": host, "host_grad_copy_bytes": staged, "device_state_bytes": dev,
            "pin_cpu_grads": bool(hdo.pin_cpu_grads)}


def optimizer_step(opt) -> tuple:
    """``opt.step()`` (megatron's ``(ok, grad_norm, num_zeros)``) with the CPU stand-ins the
    offloading optimizer's placement queries need (:func:`cuda_names_on_cpu`)."""
    with cuda_names_on_cpu(placement=True):
        return opt.step()


def checked_step(opt, who: str) -> dict:
    """One optimizer step of ``who``'s optimizer (:func:`optimizer_step`); refuses a missing
    optimizer and a skipped step (inf/nan gradients). Returns ``{"grad_norm"}``."""
    from rlk.errors import UnsupportedConfigError

    if opt is None:
        raise UnsupportedConfigError(f"{who} was built with optimizer=False: no optimizer step")
    ok, grad_norm, _ = optimizer_step(opt)
    if not ok:
        raise UnsupportedConfigError(f"{who}: megatron optimizer step skipped (found inf/nan in the gradients)")
    return {"grad_norm": None if grad_norm is None else float(grad_norm)}
