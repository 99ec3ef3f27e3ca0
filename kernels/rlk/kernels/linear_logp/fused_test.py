"""Fused logp + per-token loss path of ``logp.v2`` (``fused.py``, ``autograd.linear_logp_loss``).

CPU (interpreter): logp/lse and d_hidden/d_weight byte-identical to the unfused path
(``linear_logp_fwd`` + ``linear_logp_bwd`` fed the same dlogp) for 1, 2 and 3 row chunks; the
autograd op against ``linear_logp`` + backward; its backward's grad_out (``fused.scale_by_``: in
place, no host read, untouched bytes for grad_out 1); accuracy vs fp64; bad inputs. The interpreter
recomputes logits with the forward's tile, so it cannot show that the GPU forward tile (128x256)
and bwd_grad's (128x128) give the same logits: the ``gpu`` cases do (H200).
"""

import pytest
import torch

from rlk.errors import ExactnessError, UnsupportedConfigError
from rlk.kernels.linear_logp import contract
from rlk.kernels.linear_logp import fused, launch
from rlk.kernels.linear_logp import reference as R
from rlk.kernels.linear_logp.linear_logp_test import CPU_SEG, FWD_TOL, GRAD_TOL, _close, make
from rlk.kernels.linear_logp.autograd import linear_logp, linear_logp_loss
from rlk.testing import assert_bitwise_equal

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

T, H, V, VR, TEMP = 150, 128, 257, 250, 0.7  # padded columns 250..256, T not a multiple of 64
NAMES = ("logp", "lse", "d_hidden", "d_weight")


def _recording(dlogp, calls):
    def fn(lp, lo, hi):
        calls.append((lo, hi))
        return dlogp[lo:hi]
    return fn


def _unfused(h, w, tg, dlogp, vocab_real, temperature, seg):
    logp, lse, _, _ = launch.linear_logp_fwd(h, w, tg, 0, vocab_real, temperature, segmentation=seg)
    dh, dw = launch.linear_logp_bwd(h, w, tg, lse, dlogp, 0, vocab_real, temperature)
    return logp, lse, dh, dw


@pytest.fixture(scope="module")
def case():
    h, w, tg = make(T, H, V, VR, seed=21)
    dl = torch.randn(T, generator=torch.Generator().manual_seed(22))
    return h, w, tg, dl, _unfused(h, w, tg, dl, VR, TEMP, CPU_SEG)


def _assert_all_equal(got, ref, what):
    for name, a, b in zip(NAMES, got, ref):
        assert_bitwise_equal(a, b, f"{name}, {what}")


@pytest.mark.parametrize("rows,chunks", [(64, [(0, 64), (64, 128), (128, 150)]),
                                         (128, [(0, 128), (128, 150)]), (192, [(0, 150)])])
def test_fused_equals_unfused(case, rows, chunks):
    """(a) logp/lse = linear_logp_fwd; (b) d_hidden/d_weight = linear_logp_bwd, for 3, 2, 1 chunks."""
    h, w, tg, dl, ref = case
    calls = []
    got = fused.linear_logp_fused_loss(h, w, tg, _recording(dl, calls), 0, VR, TEMP, rows, segmentation=CPU_SEG)
    assert calls == chunks, f"row chunks {calls}, expected {chunks}"
    _assert_all_equal(got, ref, f"{len(chunks)} row chunks of {rows}")


def test_default_chunks_and_run_to_run(case):
    h, w, tg, dl, ref = case
    calls = []
    a = fused.linear_logp_fused_loss(h, w, tg, _recording(dl, calls), 0, VR, TEMP, segmentation=CPU_SEG)
    # The CPU table's 0.25 MB budget gives 170 rows at V 257 -> 2 chunks of 128 rows (unit 64).
    assert calls == [(0, 128), (128, 150)], calls
    _assert_all_equal(a, ref, "table's row chunks")
    b = fused.linear_logp_fused_loss(h, w, tg, _recording(dl, []), 0, VR, TEMP, segmentation=CPU_SEG)
    _assert_all_equal(b, a, "run to run")


def test_broken_chunk_chain_is_caught(case, monkeypatch):
    """The equality above can fail: restarting d_weight's chain at each row chunk changes it."""
    h, w, tg, dl, ref = case
    orig = launch.GradGemms.d_weight

    def restart(self, g, hidden_rows, out, *, ACC_IN, OUT_BF16):
        return orig(self, g, hidden_rows, out, ACC_IN=False, OUT_BF16=OUT_BF16)

    monkeypatch.setattr(launch.GradGemms, "d_weight", restart)
    got = fused.linear_logp_fused_loss(h, w, tg, _recording(dl, []), 0, VR, TEMP, 64, segmentation=CPU_SEG)
    assert_bitwise_equal(got[2], ref[2], "d_hidden does not use the chain")
    with pytest.raises(ExactnessError):
        assert_bitwise_equal(got[3], ref[3], "d_weight with a restarted chain")


def test_rows_per_chunk_for_budget():
    tab = contract.load_table("sm_90")
    assert fused.row_unit(tab) == 128
    # 4096 MB / (6 * 151936) = 4711 rows -> cap 4608; T 8192 -> 2 equal chunks of 4096.
    assert fused.rows_per_chunk_for(8192, 151936, tab) == 4096
    assert fused.rows_per_chunk_for(1000, 151936, tab) == 1024
    assert fused.rows_per_chunk_for(32768, 37984, tab) == 16384
    tiny = {**tab, "fused": {"ROWS_BUDGET_MB": 1}}
    assert fused.rows_per_chunk_for(5000, 151936, tiny) == 128  # never below one unit


def _ppo_like(adv, old):
    """A per-token loss built from exact ops only (mul, add, clamp, min): its gradient has the same
    bytes whatever the chunk, also on CPU (no vectorized exp whose scalar tail may differ)."""
    def loss_fn(logp, lo, hi):
        d = logp - old[lo:hi]
        a = adv[lo:hi]
        return -torch.minimum(d * a, torch.clamp(d, -0.2, 0.2) * a) + 0.05 * logp * logp
    return loss_fn


def test_autograd_op_equals_unfused_autograd():
    """(c) linear_logp_loss vs linear_logp + the same loss + backward: loss, logp, grads bitwise."""
    h, w, tg = make(T, H, V, VR, seed=23)
    g = torch.Generator().manual_seed(24)
    loss_fn = _ppo_like(torch.randn(T, generator=g), torch.randn(T, generator=g) * 0.1 - 5)
    h1, w1 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = linear_logp(h1, w1, tg, 0, VR, TEMP, segmentation=CPU_SEG)
    ref_loss = loss_fn(out.logp, 0, T).sum()
    ref_loss.backward()
    h2, w2 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, logp = linear_logp_loss(h2, w2, tg, loss_fn, 0, VR, TEMP, segmentation=CPU_SEG, rows_per_chunk=64)
    assert logp.grad_fn is None and not logp.requires_grad
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert_bitwise_equal(logp, out.logp.detach(), "logp")
    assert_bitwise_equal(loss.detach(), ref_loss.detach(), "loss")
    loss.backward()
    assert_bitwise_equal(h2.grad, h1.grad, "d_hidden, autograd")
    assert_bitwise_equal(w2.grad, w1.grad, "d_weight, autograd")

    # grad_out != 1: fp32 product rounded once; frozen weight: no d_weight, d_hidden unchanged.
    h3 = h.clone().requires_grad_(True)
    loss3, _ = linear_logp_loss(h3, w, tg, loss_fn, 0, VR, TEMP, segmentation=CPU_SEG, rows_per_chunk=64)
    (loss3 * 3.0).backward()
    assert_bitwise_equal(h3.grad, (h1.grad.float() * 3.0).to(torch.bfloat16), "d_hidden, grad_out 3")
    with torch.no_grad():
        loss4, logp4 = linear_logp_loss(h, w, tg, loss_fn, 0, VR, TEMP, segmentation=CPU_SEG)
    assert loss4.grad_fn is None
    assert_bitwise_equal(logp4, logp, "logp without grad")
    assert_bitwise_equal(loss4, loss.detach(), "loss without grad")


def test_autograd_hands_over_the_gradient_buffers(monkeypatch):
    """backward returns the d_hidden / d_weight buffers the fused pass wrote with no other owner,
    so they become .grad without a copy (a [V, H] copy per actor step otherwise); a second
    backward through the same graph is refused with a clear error (the buffers were given away)."""
    from rlk.kernels.linear_logp import fused as fused_mod
    from rlk.kernels.linear_logp import autograd as op_mod

    made = []
    real = fused_mod.linear_logp_fused_loss

    def spy(*a, **k):
        out = real(*a, **k)
        made.append((out[2].data_ptr(), out[3].data_ptr()))  # addresses only: no extra owner
        return out

    monkeypatch.setattr(op_mod, "linear_logp_fused_loss", spy)
    h, w, tg = make(T, H, V, VR, seed=25)
    hr, wr = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, _ = linear_logp_loss(hr, wr, tg, lambda lp, lo, hi: -lp, 0, VR, TEMP, segmentation=CPU_SEG)
    loss.backward(retain_graph=True)
    # Adopted, not copied: a copy is allocated while the buffer is alive, so it cannot reuse its address.
    assert (hr.grad.data_ptr(), wr.grad.data_ptr()) == made[0]
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def _spied_loss(monkeypatch, seed, scale_outputs=()):
    """linear_logp_loss whose fused pass records its gradient buffers' addresses and a copy of
    their bytes as the forward left them (the copy is a separate tensor: no extra owner)."""
    from rlk.kernels.linear_logp import fused as fused_mod
    from rlk.kernels.linear_logp import autograd as op_mod

    made = []
    real = fused_mod.linear_logp_fused_loss

    def spy(*a, **k):
        out = real(*a, **k)
        made.append(((out[2].data_ptr(), out[3].data_ptr()), (out[2].clone(), out[3].clone())))
        return out

    monkeypatch.setattr(op_mod, "linear_logp_fused_loss", spy)
    h, w, tg = make(T, H, V, VR, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    loss_fn = _ppo_like(torch.randn(T, generator=g), torch.randn(T, generator=g) * 0.1 - 5)

    def run():
        hr, wr = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        loss, _ = linear_logp_loss(hr, wr, tg, loss_fn, 0, VR, TEMP, segmentation=CPU_SEG, rows_per_chunk=64)
        return hr, wr, loss
    return run, made


def test_backward_grad_out_one_leaves_the_buffers_untouched(monkeypatch):
    """grad_out == 1 (``loss.backward()``): .grad is the very buffer the forward wrote, with the
    bytes it had after the forward (the scale kernel reads grad_out and writes nothing)."""
    run, made = _spied_loss(monkeypatch, seed=31)
    hr, wr, loss = run()
    loss.backward()
    (ph, pw), (ch, cw) = made[0]
    assert (hr.grad.data_ptr(), wr.grad.data_ptr()) == (ph, pw)
    assert_bitwise_equal(hr.grad, ch, "d_hidden, grad_out 1")
    assert_bitwise_equal(wr.grad, cw, "d_weight, grad_out 1")


@pytest.mark.parametrize("scale", [0.37, 3.0])
def test_backward_grad_out_scales_in_place(monkeypatch, scale):
    """grad_out != 1: .grad = (g.float() * fp32(grad_out)).to(bf16) bitwise (g: the grad_out-1
    gradient), formed in place in the buffer the forward wrote (still adopted without a copy)."""
    run, made = _spied_loss(monkeypatch, seed=33)
    hr, wr, loss = run()
    (loss * scale).backward()
    (ph, pw), (ch, cw) = made[0]
    assert (hr.grad.data_ptr(), wr.grad.data_ptr()) == (ph, pw)
    s32 = torch.tensor(scale, dtype=torch.float32)
    assert_bitwise_equal(hr.grad, (ch.float() * s32).to(torch.bfloat16), f"d_hidden, grad_out {scale}")
    assert_bitwise_equal(wr.grad, (cw.float() * s32).to(torch.bfloat16), f"d_weight, grad_out {scale}")


def test_backward_differentiable_grad_out_keeps_its_graph(monkeypatch):
    """create_graph with a grad_out that requires grad: the gradients carry a grad_fn back to
    grad_out (an in-place kernel would drop it) and have the same bytes as the kernel path."""
    run, made = _spied_loss(monkeypatch, seed=39)
    hr, wr, loss = run()
    c = torch.tensor(0.37, requires_grad=True)
    dh, dw = torch.autograd.grad(loss, [hr, wr], grad_outputs=c, create_graph=True)
    (_, _), (ch, cw) = made[0]
    assert dh.requires_grad and dw.requires_grad
    s32 = torch.tensor(0.37, dtype=torch.float32)
    assert_bitwise_equal(dh.detach(), (ch.float() * s32).to(torch.bfloat16), "d_hidden")
    assert_bitwise_equal(dw.detach(), (cw.float() * s32).to(torch.bfloat16), "d_weight")
    (dc,) = torch.autograd.grad(dw.float().sum(), [c])  # d(sum dw)/dc = sum of the unscaled dw
    assert torch.isfinite(dc) and dc != 0


HOST_READS = ("__bool__", "item", "__float__", "__int__", "tolist")


@pytest.mark.parametrize("scale", [None, 0.37])
def test_backward_reads_no_tensor_on_the_host(monkeypatch, scale):
    """backward never reads a tensor's value on the host (on GPU that would block the host until
    the forward has run): with Tensor.__bool__ / item / __float__ / __int__ / tolist refusing,
    loss.backward() and (loss * 0.37).backward() still give the expected gradients."""
    run, made = _spied_loss(monkeypatch, seed=35)
    hr, wr, loss = run()
    out = loss if scale is None else loss * scale

    def refuse(*a, **k):
        raise AssertionError("host read of a tensor value during linear_logp_loss's backward")

    with monkeypatch.context() as m:
        for name in HOST_READS:
            m.setattr(torch.Tensor, name, refuse)
        out.backward()
    (_, _), (ch, cw) = made[0]
    s32 = torch.tensor(1.0 if scale is None else scale, dtype=torch.float32)
    assert_bitwise_equal(hr.grad, (ch.float() * s32).to(torch.bfloat16), "d_hidden")
    assert_bitwise_equal(wr.grad, (cw.float() * s32).to(torch.bfloat16), "d_weight")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_scale_kernel_bytes(dtype):
    """fused.scale_by_ on its own: every program count and tail (the CPU tile is 512 x 2
    elements), scalars of several dtypes and layouts (a 0-dim view with a storage offset, bf16,
    fp64), products that overflow, subnormal inputs and products that underflow to subnormals or
    zero: bytes of (x.float() * scale.float()).to(dtype)."""
    g = torch.Generator().manual_seed(37)
    scales = [torch.tensor(0.37), torch.tensor(1.0), torch.full((4,), -3.0)[2],
              torch.tensor(0.37, dtype=torch.bfloat16), torch.tensor(0.37, dtype=torch.float64),
              torch.tensor(1e30), torch.tensor(1e-30), torch.tensor(2.0 ** -10), torch.tensor(-0.0)]
    for n in (1, 1023, 1024, 1025, 3000):
        x = torch.randn(n, generator=g) * 10
        if n > 4:
            x[:4] = torch.tensor([3e38, 1e-39, -1.1e-38, 3e-40])  # overflow; subnormals
            x[4:40] *= 1e-36  # products with 1e-30 / 2^-10 fall into the subnormal range or to 0
            if dtype == torch.bfloat16:
                # Triton's interpreter converts bf16 *subnormals* wrongly in both directions (a
                # 1e-39 load reads as ~4.4e-39; subnormal fp32 -> bf16 stores are off too; normal
                # values are exact), so bf16 subnormals are left to the GPU test below.
                x[1:40] = 1.0
        x = x.to(dtype)
        assert n <= 4 or dtype == torch.bfloat16 or bool((x[1:4].abs() < torch.finfo(torch.float32).tiny).all())
        for s in scales:
            ref = (x.float() * s.float()).to(dtype)
            y = x.clone()
            assert fused.scale_by_(y, s) is y
            assert_bitwise_equal(y, ref, f"n {n}, scale {s.item()} {s.dtype}")
    y = torch.randn(8, 4, generator=g).to(dtype).t().contiguous()  # 2-D contiguous: flat is fine
    ref = (y.float() * 2.5).to(dtype)
    assert_bitwise_equal(fused.scale_by_(y, torch.tensor(2.5)), ref, "2-D")
    empty = torch.empty((0, 4), dtype=dtype)
    assert fused.scale_by_(empty, torch.tensor(2.0)) is empty


def test_scale_kernel_bad_inputs():
    x = torch.zeros(8, 4, dtype=torch.bfloat16)
    s = torch.tensor(2.0)
    _bad(lambda: fused.scale_by_(x.t(), s), "contiguous")
    _bad(lambda: fused.scale_by_(x.half(), s), "bf16 or fp32")
    _bad(lambda: fused.scale_by_(x, torch.tensor(2)), "one-element float")
    _bad(lambda: fused.scale_by_(x, torch.ones(2)), "one-element float")
    _bad(lambda: fused.scale_by_(x, 2.0), "one-element float")


def test_accuracy_vs_fp64(case):
    """(d) logp/lse vs the fp64 reference; gradients within the bf16 gradient tolerance."""
    h, w, tg, dl, _ = case
    logp, lse, dh, dw = fused.linear_logp_fused_loss(h, w, tg, _recording(dl, []), 0, VR, TEMP, 64,
                                                     segmentation=CPU_SEG)
    rlogp, rlse, _ = R.linear_logp_ref(h, w, tg, 0, VR, TEMP)
    _close(logp, rlogp, FWD_TOL["cpu"], "logp")
    _close(lse, rlse, FWD_TOL["cpu"], "lse")
    rdh, rdw = R.linear_logp_grads_ref(h, w, tg, dl, vocab_real=VR, temperature=TEMP)
    for name, a, r in (("d_hidden", dh, rdh), ("d_weight", dw, rdw)):
        err = (a.double() - r).abs().max().item()
        assert err <= GRAD_TOL * r.abs().max().item(), f"{name}: max err {err:.3e}"
    assert bool((dw[VR:] == 0).all()), "padded columns get zero weight gradient"


def _bad(fn, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        fn()


def test_bad_inputs():
    """(e) clear errors before any launch."""
    h, w, tg = make(4, 64, 128, 120)
    ok = lambda lp, lo, hi: torch.ones_like(lp)  # noqa: E731
    f = fused.linear_logp_fused_loss
    kw = dict(segmentation=CPU_SEG)
    _bad(lambda: f(h, w, tg, ok, 0, 120, return_entropy=True, **kw), "entropy")
    _bad(lambda: f(h, w[:64], tg % 60, ok, 64, 120, **kw), "single-shard")
    _bad(lambda: f(h, w[:64], tg % 60, ok, 0, 120, **kw), "single-shard")
    _bad(lambda: f(h, w, tg, ok, 0, 120, rows_per_chunk=48, **kw), "multiple of")
    _bad(lambda: f(h, w, tg, ok, 0, 120, rows_per_chunk=0, **kw), "multiple of")
    _bad(lambda: f(h, w, torch.tensor([0, 1, 2, 120]), ok, 0, 120, **kw), "outside")
    _bad(lambda: f(h.float(), w, tg, ok, 0, 120, **kw), "dtype")
    _bad(lambda: f(h, w, tg[:3], ok, 0, 120, **kw), "entries")
    _bad(lambda: f(h, w, tg, ok, 0, 120, 0.0, **kw), "temperature")
    _bad(lambda: f(h, w, tg, None, 0, 120, **kw), "callable")
    _bad(lambda: f(h, w, tg, lambda lp, lo, hi: lp.double(), 0, 120, **kw), "dtype")
    _bad(lambda: f(h, w, tg, lambda lp, lo, hi: lp[:1], 0, 120, **kw), "entries")
    _bad(lambda: linear_logp_loss(h.clone().requires_grad_(True), w, tg, lambda lp, lo, hi: lp.sum(), 0, 120,
                                  segmentation=CPU_SEG), "per-token")


# ----------------------------------------------------------------------------------------------
# GPU (H200): does the stored forward logit (128x256 tile) equal bwd_grad's recomputed one
# (128x128 tile)? Only then are the fused gradients the unfused ones. Not run on CPU.

@pytest.mark.gpu
@pytest.mark.parametrize("V,vocab_real", [(37984, 37984), (151936, 151669)])
def test_gpu_fused_equals_unfused(V, vocab_real):
    h, w, tg = make(1000, 4096, V, vocab_real, device="cuda", seed=25)
    dl = torch.randn(1000, device="cuda")
    for temp in (1.0, 0.8):
        ref = _unfused(h, w, tg, dl, vocab_real, temp, None)
        for rows in (None, 384):  # 1 chunk (table budget) and 3 chunks (384, 384, 232)
            calls = []
            got = fused.linear_logp_fused_loss(h, w, tg, _recording(dl, calls), 0, vocab_real, temp, rows)
            assert len(calls) == (1 if rows is None else 3), calls
            _assert_all_equal(got, ref, f"V {V}, temperature {temp}, rows_per_chunk {rows}")


@pytest.mark.gpu
def test_gpu_autograd_op_equals_unfused_autograd():
    h, w, tg = make(700, 4096, 151936, 151669, device="cuda", seed=26)
    g = torch.Generator(device="cuda").manual_seed(27)
    adv = torch.randn(700, device="cuda", generator=g)
    old = torch.randn(700, device="cuda", generator=g) * 0.1 - 12

    def ppo(logp, lo, hi):  # GPU elementwise ops: the same bytes whatever the chunk
        ratio = torch.exp(logp - old[lo:hi])
        return -torch.minimum(ratio * adv[lo:hi], torch.clamp(ratio, 0.8, 1.2) * adv[lo:hi])

    h1, w1 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ppo(linear_logp(h1, w1, tg, 0, 151669).logp, 0, 700).sum().backward()
    h2, w2 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, _ = linear_logp_loss(h2, w2, tg, ppo, 0, 151669, rows_per_chunk=256)
    loss.backward()
    assert_bitwise_equal(h2.grad, h1.grad, "d_hidden, autograd (GPU)")
    assert_bitwise_equal(w2.grad, w1.grad, "d_weight, autograd (GPU)")


@pytest.mark.gpu
def test_gpu_scale_no_sync_and_graph_capture():
    """GPU: scale_by_ gives torch's bytes (bf16, fp32; scale 1, 0.37, 3, 2^-10; overflowing
    products, subnormal inputs and products), synchronizes nothing
    (torch's sync debug mode 'error'), and records into a CUDA graph whose replays follow the
    device scalar; linear_logp_loss's backward runs with no sync either."""
    g = torch.Generator(device="cuda").manual_seed(41)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(3001, 4099, device="cuda", generator=g) * 10
        x[0, :4] = torch.tensor([3e38, 1e-39, -1.1e-38, 3e-40])  # overflow with 3.0; subnormals
        x[1] *= 1e-36  # products with 2^-10 fall to subnormals or 0
        x = x.to(dtype)
        for v in (1.0, 0.37, 3.0, 2.0 ** -10):
            s = torch.tensor(v, device="cuda")
            y = x.clone()
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                fused.scale_by_(y, s)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert_bitwise_equal(y, (x.float() * s).to(dtype), f"{dtype}, scale {v}")
    x = torch.randn(1000, 4096, device="cuda", generator=g).to(torch.bfloat16)
    s = torch.ones((), device="cuda")
    buf = x.clone()
    fused.scale_by_(buf, s)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused.scale_by_(buf, s)
    for v in (1.0, 0.37):
        buf.copy_(x)
        s.fill_(v)
        graph.replay()
        assert_bitwise_equal(buf, (x.float() * s).to(torch.bfloat16), f"graph replay, scale {v}")

    h, w, tg = make(256, 4096, 37984, 37984, device="cuda", seed=42)
    hr, wr = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref_h = ref_w = None
    for scale in (None, 0.37):
        hr.grad = wr.grad = None
        loss, _ = linear_logp_loss(hr, wr, tg, lambda lp, lo, hi: -lp, 0, 37984)
        out = loss if scale is None else loss * scale
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if scale is None:
            ref_h, ref_w = hr.grad.clone(), wr.grad.clone()
        else:
            s32 = torch.tensor(scale, dtype=torch.float32, device="cuda")
            assert_bitwise_equal(hr.grad, (ref_h.float() * s32).to(torch.bfloat16), "d_hidden, grad_out 0.37")
            assert_bitwise_equal(wr.grad, (ref_w.float() * s32).to(torch.bfloat16), "d_weight, grad_out 0.37")
