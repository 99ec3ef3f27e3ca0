"""``launch(kernel, grid, *args, **kwargs)``: a strict kernel's launch, with less host time.

Same meaning as ``kernel[grid](*args, **kwargs)``: same compiled binary, same arguments, same
stream. What it removes is host time. On the H200 host an eager strict op's time at decode sizes
is its launch path, not its kernel (docs/results/h200_2026-12-01_session5/README.md): one Triton
launch took 38-49 us back to back against 25-30 us for two ATen ops. ``JITFunction.run`` (Triton
3.6) does, on every launch: read the debug and instrumentation knobs, ask torch for the device and
stream, bind and specialize every argument (``binder``), build its cache key (``str`` of the
options), look the compiled kernel up, check the kernel's global variables, build launch metadata,
then call the compiled kernel's launcher.

Here the first launch for a given (kernel, device, specialization, options) goes through
``kernel[grid]`` unchanged (it compiles, checks, launches and returns the ``CompiledKernel``),
and the kernel is kept under that key. Later launches with the same key call Triton's own
``binder`` (the same function ``JITFunction.run`` uses, so the specialization, the alignment
attributes, the constexpr values and the argument order are Triton's, not a copy of its rules) and
then the compiled kernel's launcher directly, as ``JITFunction.run`` ends and as PyTorch
Inductor's Triton launcher does: ``ck.run(gx, gy, gz, stream, ck.function, ck.packed_metadata,
launch_metadata, enter_hook, exit_hook, *bound_args)``; on CUDA, for kernels without scratch
buffers, the C function ``ck.run`` forwards to (see :func:`_direct_launcher`).

Every launch takes ``kernel[grid]`` (Triton's full path) when:
  * the kernel is not a ``JITFunction`` (a wrapper, an autotuner), or has pre-run hooks;
  * Triton's debug mode (``TRITON_DEBUG``, ``knobs.runtime.debug``, ``@jit(debug=True)``) or an
    instrumentation mode is on: Triton adds both to each launch's compile options, so kernels are
    cached only while both are off (and a cached kernel is never used in their place);
  * an option value cannot be a dictionary key (for example a dict of ``extern_libs``);
  * kernels run under Triton's interpreter (CPU), or the cache is off (``RLK_LAUNCH_CACHE=0`` in
    the environment at import, or :func:`set_enabled`);
  * Triton is not the version this call form was written against (``TRITON_SERIES``);
  * a launch hook is installed (``triton.knobs.runtime.launch_enter_hook`` / ``_exit_hook``, as
    profilers such as Proton do): they then get their metadata as from Triton. (In Triton 3.6
    both are ``HookChain`` objects, empty unless a tool adds to them; Triton builds launch
    metadata and calls the empty chains from its C launcher on every launch, a hit passes None);
  * a global variable the kernel reads has changed since it was cached (Triton then raises).
A :class:`LaunchSite` (on unless ``RLK_LAUNCH_SITES=0``) goes one step further for a call site
whose non-tensor arguments repeat exactly (a host plan's launch): it keeps the binder's output and
only checks the new tensors' dtypes and alignment. Nothing is skipped that changes which binary
runs or with what arguments: the binary is the one Triton compiled for these arguments and
options (L0 pins its fingerprint). Entries hold their kernels for the life of the process (rlk's
kernels are module-level and live as long anyway).
"""

from __future__ import annotations

import os
import threading

import torch
import triton
from triton import knobs

from rlk.kernels.common import interpret_flag

TRITON_SERIES = "3.6."  # the CompiledKernel.run call form below is Triton 3.6's
MAX_ENTRIES_PER_KERNEL = 256  # distinct specializations kept per kernel (then the cache restarts)

_VERSION_OK = triton.__version__.startswith(TRITON_SERIES)
_ENABLED = [os.environ.get("RLK_LAUNCH_CACHE", "1") != "0"]
_CACHE: dict = {}  # id(kernel) -> (kernel, {(device, specialization, options): (CompiledKernel, C launch)})
_LOCK = threading.Lock()
STATS = {"hits": 0, "misses": 0, "bypassed": 0, "site_hits": 0}  # counters for tests and benchmarks (not locked)


def set_enabled(enabled: bool) -> bool:
    """Turn the launch cache on or off for this process; returns the previous setting. Entries are
    kept while it is off (so A/B rounds do not recompile or re-miss; :func:`clear` empties it).
    For benchmarks and tests; production leaves it on."""
    prev = _ENABLED[0]
    _ENABLED[0] = bool(enabled)
    return prev


def enabled() -> bool:
    """Whether launches may use the cache (it is used only on GPU, never under the interpreter)."""
    return _ENABLED[0] and _VERSION_OK and not interpret_flag()


def clear() -> None:
    with _LOCK:
        _CACHE.clear()


def _device() -> int:
    # torch.cuda.current_device() without its Python wrapper (the lazy-init check): every launch
    # takes CUDA tensors, so CUDA is initialized before any launch reaches here.
    return torch._C._cuda_getDevice()


def _stream(device: int):
    return torch._C._cuda_getCurrentRawStream(device)  # what Triton's CUDA driver asks too


_HookChain = getattr(knobs, "HookChain", None)


def _hooks_idle() -> bool:
    """No launch hook would run: each is None or an empty HookChain."""
    for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if h is not None and not (type(h) is _HookChain and not h.calls):
            return False
    return True


def _globals_unchanged(fn) -> bool:
    for (name, _), (val, gdict) in fn.used_global_vals.items():
        if gdict.get(name, _MISSING) != val:
            return False
    return True


_MISSING = object()
_EMPTY: dict = {}


def _direct_launcher(ck):
    """(C launch function, cooperative-grid flag, PDL flag) of a compiled kernel whose Python
    launcher is Triton 3.6's ``CudaLauncher`` and needs no scratch buffers, else None.

    ``CudaLauncher.__call__`` only allocates the global/profile scratch (none for rlk's kernels)
    and forwards to ``self.launch`` with ``(grid, stream, function, launch_cooperative_grid,
    launch_pdl, global_scratch, profile_scratch, *args)``; calling ``self.launch`` directly skips
    one Python frame and two closures per launch. Other launchers (HIP) are called as Triton does.
    """
    run = ck.run
    if type(run).__name__ != "CudaLauncher" or run.global_scratch_size or run.profile_scratch_size:
        return None
    return run.launch, run.launch_cooperative_grid, run.launch_pdl


def launch(fn, grid, *args, **kwargs):
    """``fn[grid](*args, **kwargs)`` through the launch cache (see the module docstring).

    ``grid`` is a tuple of 1-3 ints (or a callable of the bound arguments, as in Triton). Returns
    the ``CompiledKernel``, as ``fn[grid](...)`` does.
    """
    return _launch(fn, grid, args, kwargs)[0]


def _launch(fn, grid, args, kwargs):
    """:func:`launch`, returning (CompiledKernel, (device, bound values, cache entry)); the second
    is None when the launch bypassed the cache (what a :class:`LaunchSite` keeps comes from it)."""
    if not _cacheable(fn):
        STATS["bypassed"] += 1
        return fn[grid](*args, **kwargs), None
    dev = _device()
    bound, spec, options = fn.device_caches[dev][4](*args, **kwargs)  # Triton's binder for this device
    key = (dev, tuple(spec), tuple(options.items()))
    # keyed by id(): hash(JITFunction) takes a lock and hashes its source key on every call
    entry = _CACHE.get(id(fn))
    try:
        hit = (entry[1] if entry is not None else _EMPTY).get(key)  # hashes the key, even when empty
    except TypeError:  # an unhashable option value (a dict such as extern_libs): Triton's path
        STATS["bypassed"] += 1
        return fn[grid](*args, **kwargs), None
    if hit is None or (fn.used_global_vals and not _globals_unchanged(fn)):
        ck = fn[grid](*args, **kwargs)  # compiles if needed, checks, launches
        if ck is None:  # Triton launched nothing (a jit_cache_hook chose so): nothing to keep
            return None, None
        hit = (ck, _direct_launcher(ck))
        with _LOCK:
            entry = _CACHE.setdefault(id(fn), (fn, {}))  # holding fn keeps its id unique
            if len(entry[1]) >= MAX_ENTRIES_PER_KERNEL:
                entry[1].clear()
            entry[1][key] = hit
        STATS["misses"] += 1
        return ck, (dev, bound, hit)
    ck, direct = hit
    _call(ck, direct, dev, grid(bound) if callable(grid) else grid, bound.values())
    STATS["hits"] += 1
    return ck, (dev, bound, hit)


def _call(ck, direct, dev, grid, values) -> None:
    """The compiled kernel's launch, as ``JITFunction.run`` ends (no launch metadata, no hooks)."""
    n = len(grid)
    g1, g2 = (grid[1] if n > 1 else 1), (grid[2] if n > 2 else 1)
    if direct is None:
        ck.run(grid[0], g1, g2, _stream(dev), ck.function, ck.packed_metadata, None, None, None, *values)
    else:
        direct[0](grid[0], g1, g2, _stream(dev), ck.function, direct[1], direct[2], None, None,
                  ck.packed_metadata, None, None, None, *values)


def _cacheable(fn) -> bool:
    """Whether :func:`launch` may use its cache for ``fn`` now (see the module docstring)."""
    return (getattr(fn, "device_caches", None) is not None  # not a JITFunction (a wrapper, an autotuner)
            and _ENABLED[0] and _VERSION_OK and not interpret_flag() and _hooks_idle()
            and not fn.pre_run_hooks  # Triton runs them on every launch
            # Triton adds these to every launch's options (and compile): entries are kept only
            # while they are off, so a cached kernel is never one compiled without them.
            and not (fn.debug or knobs.runtime.debug or knobs.compilation.instrumentation_mode))


# --- Launch sites ------------------------------------------------------------------------------
# On by default: on the H200 the GPU tests of kernels/ (57) pass with sites on, and sites take
# 10-45 us off attention's eager host path (docs/results/h200_2026-12-02_session8/).
# RLK_LAUNCH_SITES=0 turns them off.
_SITES = [os.environ.get("RLK_LAUNCH_SITES", "1") != "0"]
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def set_sites_enabled(enabled: bool) -> bool:
    """Turn launch sites on or off for this process; returns the previous setting."""
    prev = _SITES[0]
    _SITES[0] = bool(enabled)
    return prev


def sites_enabled() -> bool:
    return _SITES[0]


class LaunchSite:
    """One call site's last binding, for callers whose non-tensor arguments repeat exactly (a host
    plan's launch, ``rlk.kernels.plans``): ``site.launch(fn, grid, args, **kwargs)`` means
    ``launch(fn, grid, *args, **kwargs)``.

    After a launch that used the cache, the site keeps the compiled kernel and the values Triton's
    binder produced. A later call with the same kernel, grid and kwargs, the same non-tensor
    arguments (values and types), and leading tensor arguments of the same dtypes and 16-byte
    alignment (what the binder specializes a tensor on) launches those values with the new tensors
    in place, without binding again: the call a cache hit would make (launcher_test compares
    them). Anything else takes :func:`launch`. Only for argument lists that are tensors first, then
    ints, floats, bools, None; the site keeps nothing for other lists. kwargs (constexprs, options)
    are compared by value, so a site belongs to one caller that passes the same kwargs each time
    (a plan's own dict): a constexpr of equal value and another type (128 and 128.0) would reuse
    the first binding. On unless ``RLK_LAUNCH_SITES=0`` (or :func:`set_sites_enabled`).
    """

    __slots__ = ("state",)

    def __init__(self):
        self.state = None  # one tuple, replaced whole (a reader never sees half an update)

    def launch(self, fn, grid, args: tuple, **kwargs):
        st = self.state
        if st is not None and _SITES[0] and st[0] is fn and _cacheable(fn):
            (_, s_grid, s_dev, s_kwargs, n, s_tail, s_types, s_spec, s_values, ck, direct) = st
            tail = args[n:]
            if (grid == s_grid and kwargs == s_kwargs and tail == s_tail
                    and tuple(map(type, tail)) == s_types and _device() == s_dev
                    and (not fn.used_global_vals or _globals_unchanged(fn))):
                values = list(s_values)
                for i in range(n):
                    t = args[i]
                    dt, aligned = s_spec[i]
                    if t.dtype is not dt or (t.data_ptr() & 15 == 0) != aligned:  # dtypes are singletons
                        break
                    values[i] = t
                else:
                    _call(ck, direct, s_dev, grid, values)
                    STATS["site_hits"] += 1
                    return ck
        ck, served = _launch(fn, grid, args, kwargs)
        if _SITES[0]:
            self.state = _site_state(fn, grid, args, kwargs, served)
        return ck


def _site_state(fn, grid, args, kwargs, served):
    """What a site keeps after ``_launch(fn, grid, args, kwargs)`` returned ``served``, or None."""
    if served is None or callable(grid):
        return None
    n = 0
    while n < len(args) and type(args[n]) in _TENSOR_TYPES:
        n += 1
    tail = args[n:]
    if any(type(a) not in (int, float, bool, type(None)) for a in tail):
        return None
    dev, bound, (ck, direct) = served
    values = tuple(bound.values())
    if any(values[i] is not args[i] for i in range(n)):
        return None  # the tensors are not the first parameters: not this simple layout
    values = (None,) * n + values[n:]  # never hold a call's tensors (each hit puts its own in)
    spec_t = tuple((args[i].dtype, args[i].data_ptr() & 15 == 0) for i in range(n))
    return (fn, tuple(grid), dev, dict(kwargs), n, tail, tuple(map(type, tail)), spec_t, values, ck, direct)
