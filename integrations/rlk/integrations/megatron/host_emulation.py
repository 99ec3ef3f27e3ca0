"""megatron-core's host code on a machine without CUDA (CPU tests of the megatron actor).

megatron-core 0.19.2's DDP and optimizers assume a CUDA device in a few host-side
spots that carry no arithmetic: ``_ParamAndGradBuffer`` allocates its grad (and, with the
distributed optimizer, param) buffer with ``device=torch.cuda.current_device()``;
``start_grad_sync`` reads ``torch.cuda.current_stream()`` (only to wait on CUDA-graph events);
``Float16OptimizerWithFloat16Params`` / ``DistributedOptimizer`` accept a parameter only when
``param.type()`` is ``torch.cuda.BFloat16Tensor`` and create their unit loss scale with
``device='cuda'``; the schedule creates its token counter with ``device="cuda"``; activation
recompute (``tensor_parallel.checkpoint``) saves the CUDA RNG state with
``torch.cuda.random.get_rng_state``. On a machine without CUDA, :func:`cuda_names_on_cpu`
answers exactly those queries with the CPU (device ``"cuda"`` -> ``"cpu"``, a CPU tensor's
``type()`` -> the CUDA type name, a no-op stand-in stream, an empty CUDA RNG state: no CUDA
generator exists and nothing here draws random numbers) while megatron's own DDP, schedule,
recompute and optimizer code runs unmodified. It is never used when CUDA is available.

With ``placement`` (around the offloading optimizer's construction and step, see
:mod:`rlk.integrations.megatron.offload`) it also answers that optimizer's placement queries: a
tensor megatron allocated for the device (``device="cuda"`` or ``torch.cuda.current_device()``) and
what is computed from it report ``is_cuda``; ``.cpu()`` of one gives a host copy; ``pin_memory`` is a no-op (page-locking speeds
a transfer up, it computes nothing); CUDA streams and events are no-op stand-ins (CPU work is
already in order). The offloaded step is then megatron's own code path, its copies included.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

_CUDA_TYPE_NAMES = {torch.bfloat16: "torch.cuda.BFloat16Tensor", torch.float16: "torch.cuda.HalfTensor",
                    torch.float32: "torch.cuda.FloatTensor"}


# ``torch.cuda.current_device()`` on the CPU: a CPU device object of its own, so that the mode
# tells megatron's device allocations (made with it) from host ones made with ``device="cpu"``.
_DEVICE_ON_CPU = torch.device("cpu")
# Storages of the tensors megatron allocated for the device, by data pointer (dead ones drop out).
_DEVICE_STORAGES: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
_IS_CUDA = torch.Tensor.is_cuda.__get__
_FACTORIES_WITH_PIN = {torch.empty, torch.zeros, torch.ones, torch.full, torch.tensor, torch.empty_strided}


class _HostStream:
    """A CUDA stream (and ``torch.cuda.Stream()``) on the CPU: CPU work runs in program order,
    so waiting and recording are no-ops."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> "_HostEvent":
        return _HostEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _HostEvent:
    """A CUDA event on the CPU (what ``_HostStream.record_event`` returns): already complete."""

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def _on_device(t) -> bool:
    """Whether CPU tensor ``t`` stands for a device tensor (its storage is a recorded allocation)."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
        return False
    ptr = t.untyped_storage().data_ptr()
    base = _DEVICE_STORAGES.get(ptr)
    return base is not None and base.untyped_storage().data_ptr() == ptr


def _record_device(t) -> None:
    if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel() > 0:
        _DEVICE_STORAGES[t.untyped_storage().data_ptr()] = t


def _tensors_in(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


class _CudaNamesOnCpu(torch.overrides.TorchFunctionMode):
    """Factory calls asking for ``device="cuda"`` (or ``torch.cuda.current_device()``) get the
    CPU and are recorded as device allocations; a CPU tensor's ``type()`` (no arguments) reports
    the CUDA type name megatron's optimizers test for; ``pin_memory`` is a no-op.

    ``placement``: also megatron's offloading optimizer's placement queries (module docstring):
    ``is_cuda`` is True for a recorded allocation and for a new tensor computed from one (a
    device op's result stays on the device); ``.cpu()`` / ``.to("cpu")`` of one is a host copy."""

    def __init__(self, placement: bool = False):
        super().__init__()
        self.placement = placement

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and args[0].device.type == "cpu" \
                and args[0].dtype in _CUDA_TYPE_NAMES:
            return _CUDA_TYPE_NAMES[args[0].dtype]
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func in _FACTORIES_WITH_PIN and kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        dev = kwargs.get("device")
        to_device = dev is _DEVICE_ON_CPU or (dev is not None and torch.device(dev).type == "cuda")
        if to_device:
            kwargs["device"] = "cpu"
        if self.placement:
            if func == _IS_CUDA:
                return _on_device(args[0]) or func(*args, **kwargs)
            if func in (torch.Tensor.cpu, torch.Tensor.to) and args and _on_device(args[0]) and not to_device \
                    and (func is torch.Tensor.cpu or _to_cpu(args[1:], kwargs)):
                return func(*args, **kwargs).clone()  # a device -> host copy: new storage
        out = func(*args, **kwargs)
        if to_device:
            _record_device(out)
        elif self.placement and isinstance(out, torch.Tensor) and out.device.type == "cpu" and not _on_device(out):
            ins = list(_tensors_in(args, kwargs))
            if any(_on_device(t) for t in ins) and \
                    all(t.untyped_storage().data_ptr() != out.untyped_storage().data_ptr() for t in ins):
                _record_device(out)
        return out


def _to_cpu(args, kwargs) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names the CPU as its target device."""
    for a in list(args) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu":
            return True
    return False


@contextlib.contextmanager
def cuda_names_on_cpu(placement: bool = False):
    """Runs megatron's DDP / schedule / optimizer host code on a machine without CUDA (module
    docstring lists every query it answers); ``placement``: also the offloading optimizer's
    device-placement queries (only around the optimizer's construction and step: rlk's kernels
    read ``is_cuda`` too and must see the truth). A no-op when CUDA is available."""
    if torch.cuda.is_available():
        yield
        return
    saved = (torch.cuda.current_device, torch.cuda.current_stream, torch.cuda.Stream,
             torch.cuda.random.get_rng_state)
    torch.cuda.current_device = lambda: _DEVICE_ON_CPU
    stream = _HostStream()
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.Stream = _HostStream
    # No CUDA generator exists, so there is no state to save (megatron's restore of it is queued
    # by torch for a CUDA initialization that never comes).
    torch.cuda.random.get_rng_state = lambda *a, **k: torch.empty((0,), dtype=torch.uint8)
    try:
        with _CudaNamesOnCpu(placement):
            yield
    finally:
        (torch.cuda.current_device, torch.cuda.current_stream, torch.cuda.Stream,
         torch.cuda.random.get_rng_state) = saved
