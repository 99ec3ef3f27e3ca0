"""Value checks of the row ops (ids / positions within range): the three modes ("device",
"host", "off"), what each route reads back or asserts, the environment variable, the per-build
choice (ROCm), and on the GPU that bad values fail closed (each case in its own process).
docs/API.md, "Value checks"."""

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels.rowops import launch as L
from rlk.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _data(shape, seed=0, dtype=torch.bfloat16, device=DEV):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def test_value_check_modes():
    """set_value_checks accepts the three modes (True / False for device / off), returns the
    previous one and rejects anything else with a clear error."""
    prev = L.value_checks()
    try:
        for given, mode in ((True, "device"), (False, "off"), ("host", "host"), ("off", "off"), ("device", "device")):
            before = L.value_checks()
            assert L.set_value_checks(given) == before
            assert L.value_checks() == mode
        for bad in ("on", "sync", 1, None):
            with pytest.raises(UnsupportedConfigError, match="value checks"):
                L.set_value_checks(bad)
    finally:
        L.set_value_checks(prev)


@pytest.mark.parametrize("env, want", [("host", "host"), ("off", "off"), (None, "device"), ("HOST", "error")])
def test_value_checks_environment_variable(env, want):
    """RLK_VALUE_CHECKS sets the starting mode (the provenance records it); a wrong value fails
    the import with the error that names the modes."""
    import os
    import subprocess
    import sys

    code = ("from rlk.kernels.rowops import launch as L; from rlk import provenance as P; "
            "print(L.value_checks(), P.toolchain()['value_checks'])")
    envs = {k: v for k, v in os.environ.items() if k != "RLK_VALUE_CHECKS"}
    if env is not None:
        envs["RLK_VALUE_CHECKS"] = env
    envs["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=envs, timeout=300)
    if want == "error":
        assert r.returncode != 0 and "is not one of" in r.stderr, r.stderr[-2000:]
    else:
        assert r.returncode == 0, r.stderr[-2000:]
        mode, recorded = r.stdout.split()[-2:]
        assert mode == want and recorded == (("host" if want == "device" and torch.version.hip else want))


def test_device_checks_read_nothing_back_and_fail_closed(monkeypatch):
    """The "device" route (what a GPU tensor takes by default), driven on the CPU (on a GPU the
    bad values below would end the CUDA context): no (min, max) read back; RoPE gathers from an
    n-byte scratch row at the positions (a device-side assert on a GPU, RuntimeError here), the
    embedding copy (its short route too) relies on its own index_select; the embedding backward
    checks its sorted ids on the host in every mode; in-range results are the host route's bytes."""
    dev = "cpu"
    T, nh, D, V, H = 5, 2, 16, 40, 24
    x = _data((T, nh, D), 50, device=dev)
    cos, sin = L.rope_table(32, D, 10000.0, dev)
    pos = torch.tensor([3, 1, 31, 0, 3], device=dev)
    w = _data((V, H), 51, device=dev)
    ids = torch.tensor([5, 0, 39, 5], device=dev)
    dy = _data((4, H), 52, device=dev)
    want = (L.apply_rope(x, pos, cos, sin), L.embedding(ids, w), L.embedding_backward(dy, ids, V))
    L._TABLE_BY_INDEX.setdefault(w.get_device(), L.schedule.table("cpu-interpreter"))  # the short route's arch memo
    reads, asserts, short = [], [], []
    real_span, real_assert, real_short = L._span, L._assert_in_range_on_device, L._copy_route_short
    monkeypatch.setattr(L, "_span", lambda t: reads.append(1) or real_span(t))
    monkeypatch.setattr(L, "_assert_in_range_on_device", lambda t, n: asserts.append(n) or real_assert(t, n))
    monkeypatch.setattr(L, "_check_mode", lambda t: "device")
    for drive_short in (False, True):
        monkeypatch.setattr(L, "_device_copy_route", lambda t: drive_short)
        monkeypatch.setattr(L, "_copy_route_short", lambda i, w_: short.append(real_short(i, w_)) or short[-1])
        reads.clear(), asserts.clear(), short.clear()
        got = (L.apply_rope(x, pos, cos, sin), L.embedding(ids, w), L.embedding_backward(dy, ids, V))
        for g, e, what in zip(got, want, ("rope", "embedding", "embedding backward")):
            assert_bitwise_equal(g, e, f"{what}: device-checked vs host-checked (short route {drive_short})")
        assert reads == [], "device checks read a value back"
        assert asserts == [32], "RoPE asserts once; the copy relies on its own gather"
        assert short == [drive_short], "the short copy route taken exactly when driven"
        for bad in ([3, 1, 32, 0, 3], [3, -1, 2, 0, 3], [3, 1, 2**32 + 3, 0, 3]):
            with pytest.raises(IndexError):
                L.apply_rope(x, torch.tensor(bad, device=dev), cos, sin)
        for bad in ([5, 40], [-1, 2]):
            with pytest.raises(IndexError):
                L.embedding(torch.tensor(bad, device=dev), w)
            with pytest.raises(UnsupportedConfigError, match="embedding backward: ids out of range"):
                L.embedding_backward(dy[:2], torch.tensor(bad, device=dev), V)
        with pytest.raises(IndexError):
            L.embedding_kernel(torch.tensor([40], device=dev), w)
        assert reads == []


def test_embedding_backward_checks_ids_in_every_mode():
    """The backward synchronizes anyway (unique_consecutive), so its host check runs whatever the
    mode, "off" included (its kernel would write outside dW); only host_validated() skips it."""
    from rlk.kernels.common import host_validated

    dy = _data((2, 8), 53)
    prev = L.value_checks()
    try:
        for mode in ("device", "host", "off"):
            L.set_value_checks(mode)
            for bad in ([1, 4], [-1, 0]):
                with pytest.raises(UnsupportedConfigError, match="embedding backward: ids out of range"):
                    L.embedding_backward(dy, torch.tensor(bad, device=DEV), 4)
    finally:
        L.set_value_checks(prev)
    with host_validated():
        assert L.embedding_backward(dy, torch.tensor([1, 3], device=DEV), 4).shape == (4, 8)


def test_assert_in_range_on_device_bounds():
    for dtype in (torch.int64, torch.int32):
        L._assert_in_range_on_device(torch.tensor([0, 9, 4], dtype=dtype), 10)
        for bad in ([0, 10], [-1, 3], [2**31 - 1]) + (([2**32 + 5],) if dtype == torch.int64 else ()):
            with pytest.raises(IndexError):
                L._assert_in_range_on_device(torch.tensor(bad, dtype=dtype), 10)


def test_check_mode_per_build_and_capture(monkeypatch):
    """Which check a GPU tensor gets: "device" only where torch's kernel asserts exist (CUDA
    builds); ROCm builds read back ("host") outside capture and leave the kernels' NaN rows
    ("off") during capture, where nothing may be read."""
    from types import SimpleNamespace

    from rlk.kernels import common
    from rlk.kernels.common import host_validated

    gpu, cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    prev = L.value_checks()
    try:
        for asserts, mode, cap, want in ((True, "device", False, "device"), (True, "device", True, "device"),
                                         (True, "host", False, "host"), (True, "host", True, "device"),
                                         (False, "device", False, "host"), (False, "device", True, "off"),
                                         (False, "host", False, "host"), (False, "host", True, "off"),
                                         (True, "off", False, "off"), (False, "off", True, "off")):
            monkeypatch.setattr(common, "DEVICE_ASSERTS", asserts)
            L.set_value_checks(mode)
            capturing[0] = cap
            assert L._check_mode(gpu) == want, (asserts, mode, cap)
            assert L.effective_value_checks() == ("host" if mode == "device" and not asserts else mode)
            assert L._check_mode(cpu) == ("off" if mode == "off" else "host")
            with host_validated():
                assert L._check_mode(gpu) == "off"
    finally:
        L.set_value_checks(prev)


_BAD_VALUE_SCRIPT = """
import sys, torch
from rlk.kernels.rowops import launch as L
case = sys.argv[1]
w = torch.randn(64, 32, device="cuda").to(torch.bfloat16)
cos, sin = L.rope_table(16, 8, 10000.0, "cuda")
x = torch.randn(3, 2, 8, device="cuda").to(torch.bfloat16)
if case == "good":
    L.apply_rope(x, torch.tensor([0, 15, 3], device="cuda"), cos, sin)
    L.embedding(torch.tensor([0, 63, 5], device="cuda"), w)
    L.embedding_backward(torch.ones(3, 32, device="cuda"), torch.tensor([0, 63, 5], device="cuda"), 64)
elif case == "rope":
    L.apply_rope(x, torch.tensor([0, 16, 3], device="cuda"), cos, sin)
elif case == "rope_2pow32":  # may alias in index_select's 32-bit compare; the kernel then writes NaN
    y = L.apply_rope(x, torch.tensor([0, 2**32 + 3, 3], device="cuda"), cos, sin)
    torch.cuda.synchronize()
    print("nan_row", bool(torch.isnan(y[1].float()).all()), bool(torch.isnan(y[[0, 2]].float()).any()), flush=True)
elif case == "ids_high":
    L.embedding(torch.tensor([0, 64, 5], device="cuda"), w)
elif case == "ids_negative":
    L.embedding(torch.tensor([0, -1, 5], device="cuda"), w)
elif case == "bwd_ids":
    L.embedding_backward(torch.ones(3, 32, device="cuda"), torch.tensor([0, 64, 5], device="cuda"), 64)
torch.cuda.synchronize()
print("synchronized", flush=True)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["good", "rope", "rope_2pow32", "ids_high", "ids_negative", "bwd_ids"])
def test_gpu_device_checks_fail_closed(case, tmp_path):
    """Default ("device") value checks on a GPU: an out-of-range position or id fails the stream
    with a device-side assert (not the host check's UnsupportedConfigError: nothing was read back),
    never a silent wrong row; the embedding backward raises its host check's error. Each case in its own process (the assert ends the CUDA context). That
    the in-range calls read nothing back is test_gpu_embedding_routes_and_graph_capture's capture."""
    import os
    import subprocess
    import sys

    script = tmp_path / "bad_value.py"
    script.write_text(_BAD_VALUE_SCRIPT)
    env = {**os.environ, "RLK_VALUE_CHECKS": "device", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True, env=env, timeout=300)
    out = r.stdout + r.stderr
    if case == "good":
        assert r.returncode == 0 and "synchronized" in r.stdout, out[-3000:]
    elif case == "bwd_ids":  # the backward synchronizes anyway: its host check names the ids
        assert r.returncode != 0 and "embedding backward: ids out of range" in out, out[-3000:]
    elif case == "rope_2pow32" and "nan_row" in r.stdout:  # aliased past the assert: a visible NaN row
        assert "nan_row True False" in r.stdout, out[-3000:]
    else:  # the assert may surface at any later CUDA call (a module load, a sort), not only at the sync
        assert r.returncode != 0 and "synchronized" not in r.stdout, f"bad value passed: {out[-3000:]}"
        assert "device-side assert" in out and "UnsupportedConfigError" not in out, out[-3000:]
