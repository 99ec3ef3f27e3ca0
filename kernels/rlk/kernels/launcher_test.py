"""rlk.kernels.launcher: the launch cache.

CPU tests drive ``launch`` with a JITFunction whose compile-and-launch (``fn[grid]``) and compiled
kernel are recorders, and Triton's real binder for an sm_90 target (it needs no GPU): they check
which launches take Triton's full path, which hit the cache, and the exact call made on a hit.
GPU tests check that cached launches give the same bytes as Triton's own launch.
"""

from __future__ import annotations

import pytest
import torch
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import JITFunction, create_function_from_signature

from rlk.kernels import launcher as LA


def _kern(out_ptr, x_ptr, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
    pass


class _Compiled:
    def __init__(self, tag):
        self.function, self.packed_metadata, self.calls, self.tag = f"fn-{tag}", f"meta-{tag}", [], tag

    def run(self, *args):
        self.calls.append(args)


class _Recorded(JITFunction):
    """A JITFunction whose ``fn[grid](...)`` (Triton's compile + launch) is recorded, not run."""

    def __init__(self, fn):
        super().__init__(fn)
        binder = create_function_from_signature(self.signature, self.params, CUDABackend(GPUTarget("cuda", 90, 32)))
        self.device_caches = {0: (None, None, None, None, binder), 1: (None, None, None, None, binder)}
        self.slow = []
        self.used_global_vals = {}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            ck = _Compiled(len(self.slow))
            self.slow.append((grid, args, kwargs))
            return ck
        return run


@pytest.fixture
def env(monkeypatch):
    dev = {"index": 0}
    monkeypatch.setattr(LA, "interpret_flag", lambda: False)
    monkeypatch.setattr(LA, "_VERSION_OK", True)
    monkeypatch.setattr(LA, "_device", lambda: dev["index"])
    monkeypatch.setattr(LA, "_stream", lambda d: 700 + d)
    monkeypatch.setattr(LA, "_ENABLED", [True])
    for k in LA.STATS:
        monkeypatch.setitem(LA.STATS, k, 0)
    LA.clear()
    yield dev
    LA.clear()


def _args(n=64, offset=0):
    x = torch.zeros(256, dtype=torch.bfloat16)[offset:]
    out = torch.zeros(256, dtype=torch.float32)
    return out, x, n, 0.5


def test_second_launch_calls_the_compiled_kernel_with_tritons_bound_args(env):
    fn = _Recorded(_kern)
    out, x, n, s = _args()
    ck = LA.launch(fn, (3,), out, x, n, s, BLOCK=128, num_warps=4, enable_fp_fusion=False)
    assert len(fn.slow) == 1 and ck.calls == [] and LA.STATS["misses"] == 1
    out2, x2, _, _ = _args()
    assert LA.launch(fn, (5, 2), out2, x2, 80, 0.25, BLOCK=128, num_warps=4, enable_fp_fusion=False) is ck
    assert len(fn.slow) == 1 and LA.STATS["hits"] == 1
    (call,) = ck.calls
    # grid padded to 3, the current stream, the kernel's handle and metadata, no hooks, then every
    # parameter in signature order: this call's tensors and ints, the constexprs and defaults.
    assert call[:9] == (5, 2, 1, 700, "fn-0", "meta-0", None, None, None)
    assert call[9] is out2 and call[10] is x2 and call[11:] == (80, 0.25, 128, False)


@pytest.mark.parametrize("change", ["misaligned", "int_is_one", "int_not_16", "int_64bit", "constexpr", "option",
                                    "device", "dtype"])
def test_a_new_specialization_takes_tritons_path(env, change):
    fn = _Recorded(_kern)
    kw = dict(BLOCK=128, num_warps=4)
    out, x, n, s = _args()
    LA.launch(fn, (1,), out, x, n, s, **kw)
    if change == "misaligned":
        x = _args(offset=1)[1]  # 2 bytes off: Triton drops the 16-byte alignment attribute
    elif change == "int_is_one":
        n = 1  # Triton makes an int argument equal to 1 a constant
    elif change == "int_not_16":
        n = 65
    elif change == "int_64bit":
        n = 2**31  # a multiple of 16 like 64, but past int32: Triton passes it as i64
    elif change == "constexpr":
        kw["BLOCK"] = 256
    elif change == "option":
        kw["num_warps"] = 8
    elif change == "device":
        env["index"] = 1
    elif change == "dtype":
        out = out.to(torch.float16)
    LA.launch(fn, (1,), out, x, n, s, **kw)
    assert len(fn.slow) == 2 and LA.STATS["hits"] == 0, change
    LA.launch(fn, (1,), out, x, n, s, **kw)  # and is cached under its own key
    assert len(fn.slow) == 2 and LA.STATS["hits"] == 1, change


def test_same_specialization_other_values_hits_and_passes_the_new_values(env):
    fn = _Recorded(_kern)
    out, x, _, _ = _args()
    ck = LA.launch(fn, (1,), out, x, 64, 0.5, BLOCK=128)
    LA.launch(fn, (1,), out, x, 4096, 3.0, BLOCK=128)  # both ints are multiples of 16
    LA.launch(fn, (1,), out, x, 32, 1.0, BLOCK=128, FLAG=False)  # the default, spelled out: same key
    assert len(fn.slow) == 1 and ck.calls[0][11:13] == (4096, 3.0) and ck.calls[1][11:13] == (32, 1.0)
    LA.launch(fn, (1,), out, x, 32, 1.0, BLOCK=128, FLAG=True)
    assert len(fn.slow) == 2


@pytest.mark.parametrize("why", ["disabled", "interpreter", "enter_hook", "exit_hook", "enter_chain", "exit_chain",
                                 "global_changed", "version", "knob_debug", "jit_debug", "instrumentation",
                                 "pre_run_hook"])
def test_bypass_takes_tritons_path_every_time(env, monkeypatch, why):
    fn = _Recorded(_kern)
    args = _args()
    LA.launch(fn, (1,), *args, BLOCK=128)
    if why == "disabled":
        assert LA.set_enabled(False) is True
    elif why == "interpreter":
        monkeypatch.setattr(LA, "interpret_flag", lambda: True)
    elif why == "version":
        monkeypatch.setattr(LA, "_VERSION_OK", False)
    elif why == "global_changed":
        g = {"SCALE": 2}
        fn.used_global_vals = {("SCALE", 0): (1, g)}
    elif why == "knob_debug":  # TRITON_DEBUG: Triton would compile (and key) a debug binary
        from triton import knobs

        monkeypatch.setattr(knobs.runtime, "debug", True)
    elif why == "jit_debug":
        fn.debug = True
    elif why == "instrumentation":
        from triton import knobs

        monkeypatch.setattr(knobs.compilation, "instrumentation_mode", "consan")
    elif why == "pre_run_hook":
        fn.add_pre_run_hook(lambda *a, **k: None)
    elif why.endswith("_hook"):  # a plain function in place of Triton's chain
        from triton import knobs

        monkeypatch.setattr(knobs.runtime, "launch_" + why, lambda *a: None)
    else:  # a hook added to Triton's chain, as Proton does
        from triton import knobs

        chain = knobs.HookChain()
        chain.add(lambda *a: None)
        monkeypatch.setattr(knobs.runtime, "launch_" + why.replace("chain", "hook"), chain)
    for _ in range(2):
        LA.launch(fn, (1,), *args, BLOCK=128)
    assert len(fn.slow) == 3 and LA.STATS["hits"] == 0, why


class CudaLauncher:
    """Stands for Triton 3.6's CudaLauncher (matched by class name): records calls of its C
    ``launch``; scratch sizes as given."""

    def __init__(self, scratch=0):
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.calls, self.py_calls = [], []
        self.launch = lambda *a: self.calls.append(a)

    def __call__(self, *a):
        self.py_calls.append(a)


@pytest.mark.parametrize("scratch", [0, 64])
def test_cuda_launcher_without_scratch_is_called_at_its_c_launch(env, scratch):
    """CudaLauncher.__call__(g, stream, function, *rest) = launch(g, stream, function, coop, pdl,
    global_scratch, profile_scratch, *rest): the hit calls ``launch`` with that layout; a kernel
    that needs scratch goes through ``__call__`` (which allocates it)."""
    ck = _Compiled(0)
    ck.run = run = CudaLauncher(scratch)

    class WithLauncher(_Recorded):
        def __getitem__(self, grid):
            return lambda *a, **k: (self.slow.append(grid), ck)[1]

    fn = WithLauncher(_kern)
    out, x, n, s = _args()
    LA.launch(fn, (3,), out, x, n, s, BLOCK=128)  # miss: Triton's path returns ck
    LA.launch(fn, (4, 2), out, x, n, s, BLOCK=128)  # hit
    assert len(fn.slow) == 1 and LA.STATS["hits"] == 1
    if scratch:
        assert run.calls == [] and len(run.py_calls) == 1
        assert run.py_calls[0][:9] == (4, 2, 1, 700, "fn-0", "meta-0", None, None, None)
    else:
        assert run.py_calls == [] and len(run.calls) == 1
        call = run.calls[0]
        assert call[:13] == (4, 2, 1, 700, "fn-0", False, True, None, None, "meta-0", None, None, None)
        assert call[13] is out and call[14] is x and call[15:] == (n, s, 128, False)


def test_objects_that_are_not_jit_functions_take_their_own_path(env):
    """A wrapper with only ``__getitem__`` (tests' spies, Triton's Autotuner) is launched as is."""
    fn = _Recorded(_kern)
    log = []

    class Spy:
        def __getitem__(self, grid):
            log.append(grid)
            return fn[grid]

    spy = Spy()
    for _ in range(2):
        LA.launch(spy, (2,), *_args(), BLOCK=128)
    assert log == [(2,), (2,)] and len(fn.slow) == 2 and LA.STATS["bypassed"] == 2


def test_unhashable_option_and_a_launch_triton_declines(env):
    """An option Triton accepts but a key cannot hold (a dict, as extern_libs) takes Triton's path
    every time; a launch for which Triton returns no kernel (a jit_cache_hook declined) is kept
    nowhere and returns None, as Triton's does."""
    fn = _Recorded(_kern)
    args = _args()
    for _ in range(2):
        LA.launch(fn, (1,), *args, BLOCK=128, extern_libs={"libdevice": "/x.bc"})
    assert len(fn.slow) == 2 and LA.STATS["bypassed"] == 2 and LA.STATS["misses"] == 0

    class Declines(_Recorded):
        def __getitem__(self, grid):
            return lambda *a, **k: (self.slow.append(grid), None)[1]

    fn = Declines(_kern)
    assert LA.launch(fn, (1,), *args, BLOCK=128) is None
    assert LA.launch(fn, (1,), *args, BLOCK=128) is None
    assert len(fn.slow) == 2 and LA.STATS["hits"] == 0


def test_cache_restarts_when_full(env, monkeypatch):
    monkeypatch.setattr(LA, "MAX_ENTRIES_PER_KERNEL", 2)
    fn = _Recorded(_kern)
    args = _args()
    for block in (16, 32, 64):  # the third entry empties the kernel's table first
        LA.launch(fn, (1,), *args, BLOCK=block)
    LA.launch(fn, (1,), *args, BLOCK=64)
    LA.launch(fn, (1,), *args, BLOCK=16)
    assert len(fn.slow) == 4 and LA.STATS["hits"] == 1


def test_callable_grid_gets_the_bound_arguments(env):
    fn = _Recorded(_kern)
    args = _args()
    seen = []

    def grid(meta):
        seen.append(dict(meta))
        return (meta["n"] // 16,)

    ck = LA.launch(fn, grid, *args, BLOCK=128)
    LA.launch(fn, grid, *args, BLOCK=128)
    assert seen[-1]["n"] == 64 and seen[-1]["BLOCK"] == 128 and ck.calls[0][:3] == (4, 1, 1)


def test_real_launches_under_the_interpreter_bypass():
    """In CI (interpreter) every launch takes Triton's path: the cache is GPU-only."""
    from rlk.kernels.common import interpret_flag

    if not interpret_flag():
        pytest.skip("checks the interpreter's path; this run has a GPU")
    from rlk.kernels.rowops import launch as R

    before = dict(LA.STATS)
    y = R.swiglu(torch.randn(3, 8))
    assert y.shape == (3, 4) and LA.STATS["bypassed"] == before["bypassed"] + 1
    assert LA.STATS["hits"] == before["hits"] and not LA.enabled()


# ----------------------------------------------------------------------------------- launch sites
def _counting_binder(fn):
    calls = []
    binder = fn.device_caches[0][4]

    def counted(*a, **k):
        calls.append(1)
        return binder(*a, **k)
    fn.device_caches = {d: (None, None, None, None, counted) for d in fn.device_caches}
    return calls


def _same_call(a, b):
    """Two recorded launch calls: equal, tensors compared by identity."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is y) if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) else x == y, (x, y)


def test_site_repeats_the_cache_hit_call_without_binding(env, monkeypatch):
    monkeypatch.setattr(LA, "_SITES", [True])
    fn = _Recorded(_kern)
    binds = _counting_binder(fn)
    site = LA.LaunchSite()
    out, x, n, s = _args()
    ck = site.launch(fn, (3, 2), (out, x, n, s), BLOCK=128, num_warps=4)  # miss: Triton's path
    assert len(fn.slow) == 1 and ck.calls == []
    out2, x2, _, _ = _args()
    b0 = len(binds)
    assert site.launch(fn, (3, 2), (out2, x2, n, s), BLOCK=128, num_warps=4) is ck
    assert len(binds) == b0 and LA.STATS["site_hits"] == 1, "the site bound the arguments again"
    LA.launch(fn, (3, 2), out2, x2, n, s, BLOCK=128, num_warps=4)  # the cache hit, for comparison
    assert len(ck.calls) == 2
    _same_call(ck.calls[0], ck.calls[1])
    assert ck.calls[0][9] is out2 and ck.calls[0][10] is x2


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int_value", "float_for_int", "kwarg", "grid",
                                    "device", "sites_off"])
def test_site_takes_launch_for_anything_else(env, monkeypatch, change):
    monkeypatch.setattr(LA, "_SITES", [True])
    fn = _Recorded(_kern)
    site = LA.LaunchSite()
    out, x, n, s = _args()
    kw, grid = dict(BLOCK=128), (3,)
    site.launch(fn, grid, (out, x, n, s), **kw)
    site.launch(fn, grid, (out, x, n, s), **kw)
    assert LA.STATS["site_hits"] == 1
    if change == "misaligned":
        x = _args(offset=1)[1]
    elif change == "dtype":
        out = out.to(torch.float16)
    elif change == "int_value":
        n = 80  # same specialization (multiple of 16), another value: must reach the kernel
    elif change == "float_for_int":
        n = 64.0  # equal to 64, but a float: Triton binds it as fp32
    elif change == "kwarg":
        kw["FLAG"] = True
    elif change == "grid":
        grid = (4,)
    elif change == "device":
        env["index"] = 1
    elif change == "sites_off":
        LA._SITES[0] = False
    hits = LA.STATS["hits"] + LA.STATS["misses"]
    ck = site.launch(fn, grid, (out, x, n, s), **kw)
    assert LA.STATS["site_hits"] == 1, f"{change}: the site repeated a launch it must not"
    assert LA.STATS["hits"] + LA.STATS["misses"] == hits + 1, change  # it went through launch()
    if change == "int_value":
        assert ck.calls[-1][11] == 80
    if change == "grid":
        assert ck.calls[-1][:3] == (4, 1, 1)


def test_site_holds_no_tensor_of_its_calls(env, monkeypatch):
    """A site lives as long as its plan (hundreds of them): holding a call's tensors would keep
    their device memory alive."""
    import gc
    import weakref

    monkeypatch.setattr(LA, "_SITES", [True])
    fn = _Recorded(_kern)
    site = LA.LaunchSite()
    out, x, n, s = _args()
    refs = [weakref.ref(out), weakref.ref(x)]
    site.launch(fn, (1,), (out, x, n, s), BLOCK=128)
    ck = site.launch(fn, (1,), (out, x, n, s), BLOCK=128)
    assert site.state is not None and LA.STATS["site_hits"] == 1
    ck.calls.clear()  # the recorders keep their own copies of the calls
    fn.slow.clear()
    del out, x
    gc.collect()
    assert all(r() is None for r in refs), "the site keeps a tensor alive"


def test_site_keeps_nothing_for_other_layouts_or_under_the_interpreter(env, monkeypatch):
    monkeypatch.setattr(LA, "_SITES", [True])
    fn = _Recorded(_kern)
    out, x, n, s = _args()
    site = LA.LaunchSite()
    site.launch(fn, (1,), (out, n, x, s), BLOCK=128)  # a tensor after an int: not the simple layout
    assert site.state is None
    site.launch(fn, (1,), (out, x, n, s), BLOCK=128)
    assert site.state is not None
    monkeypatch.setattr(LA, "interpret_flag", lambda: True)
    site = LA.LaunchSite()
    site.launch(fn, (1,), (out, x, n, s), BLOCK=128)
    assert site.state is None and LA.STATS["site_hits"] == 0


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_cached_launches_are_bitwise_tritons():
    """Every row op, attention prefill and the fused logp forward: cache off (Triton's launch) vs
    on (first launch fills, later ones hit), same bytes; misaligned and odd-sized inputs too."""
    from rlk.kernels.attention import launch as A
    from rlk.kernels.linear_logp import launch as LP
    from rlk.kernels.rowops import launch as R

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def rn(*shape):
        return torch.randn(shape, generator=g, device=dev).to(torch.bfloat16)

    x, r, w = rn(7, 512), rn(7, 512), rn(512)
    gu = rn(5, 2 * 384)
    gu_odd = rn(1, 2 * 384 + 2)[:, 1:-1]  # a view 2 bytes off 16-byte alignment, odd stride
    q, k, v = rn(64, 4, 64), rn(64, 2, 64), rn(64, 2, 64)
    cu = torch.tensor([0, 40, 64], dtype=torch.int32, device=dev)
    h, wl = rn(9, 256), rn(1000, 256)
    tg = torch.randint(0, 1000, (9,), generator=g, device=dev)
    cases = {
        "rms_norm": lambda: R.rms_norm(x, w, 1e-6),
        "add_rms_norm": lambda: R.add_rms_norm(x, r, w, 1e-6),
        "swiglu": lambda: R.swiglu(gu),
        "swiglu_misaligned": lambda: R.swiglu(gu_odd),
        "prefill": lambda: A.prefill(q, k, v, cu, 40, 64 ** -0.5, validate=False),
        "logp": lambda: LP.linear_logp_fwd(h, wl, tg, validate_targets=False),
    }

    def flat(o):
        return [t for t in (o if isinstance(o, (tuple, list)) else (o,)) if isinstance(t, torch.Tensor)]

    prev = LA.set_enabled(False)
    try:
        ref = {name: flat(fn()) for name, fn in cases.items()}
        LA.set_enabled(True)
        hits0 = LA.STATS["hits"]
        for _ in range(3):
            for name, fn in cases.items():
                got = flat(fn())
                assert len(got) == len(ref[name]), name
                for a, b in zip(got, ref[name]):
                    assert torch.equal(a.view(torch.uint8) if a.dtype != torch.bool else a,
                                       b.view(torch.uint8) if b.dtype != torch.bool else b), name
        assert LA.STATS["hits"] > hits0 + len(cases), LA.STATS
    finally:
        LA.set_enabled(prev)


@pytest.mark.gpu
def test_gpu_cached_launch_uses_the_current_stream():
    """A cache hit inside CUDA-graph capture (torch.cuda.graph captures on its own stream): the
    launch must go to that stream, or capture fails / the replayed graph leaves ``y`` stale."""
    from rlk.kernels.rowops import launch as R

    gu = torch.randn(64, 2 * 1024, device="cuda").to(torch.bfloat16)
    R.swiglu(gu)  # fills the cache on the default stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        R.swiglu(gu)  # warm-up on a side stream, as the CUDA-graphs recipe says
    torch.cuda.current_stream().wait_stream(side)
    hits = LA.STATS["hits"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = R.swiglu(gu)
    assert LA.STATS["hits"] == hits + 1
    gu.copy_(torch.randn(64, 2 * 1024, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.view(torch.uint8), R.swiglu(gu).view(torch.uint8))

