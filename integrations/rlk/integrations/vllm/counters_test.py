"""Run-time counters: the check fails closed (stock attention ran, rlk ops missing, no worker)."""

import pytest

from rlk.errors import ExactnessError
from rlk.integrations.vllm import counters

GOOD = {"linear": 16, "attn_paged": 4, "write_kv": 4, "logits_logp": 2}


def test_check_passes_on_strict_worker():
    s = counters.check([{"pid": 1, "counts": GOOD, "contracts": {"attention": "attn.v2"}}])
    assert s["strict_backend_ran"] and s["counts"]["linear"] == 16 and s["contracts"] == {"attention": "attn.v2"}


def test_check_fails_when_stock_attention_ran():
    with pytest.raises(ExactnessError, match="stock attention ran"):
        counters.check([{"pid": 1, "counts": {**GOOD, counters.STOCK: 1}}])


@pytest.mark.parametrize("op", counters.REQUIRED)
def test_check_fails_when_an_rlk_op_never_ran(op):
    c = dict(GOOD)
    del c[op]
    with pytest.raises(ExactnessError, match=op):
        counters.check([{"pid": 1, "counts": c}])


def test_check_fails_without_worker_files(tmp_path):
    with pytest.raises(ExactnessError, match="0 worker counter files"):
        counters.check(counters.read(str(tmp_path)))


def test_flush_and_read_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv(counters.ENV_DIR, str(tmp_path))
    c = counters.Counters({"contracts": {"gemm": "gemm.bf16.v1"}})
    ops = counters.CountingOps(type("O", (), {"linear": lambda self, x: x + 1, "name": "strict"})(), c)
    assert ops.linear(1) == 2 and ops.name == "strict"
    c.flush()
    (rec,) = counters.read(str(tmp_path))
    assert rec["counts"] == {"linear": 1} and rec["contracts"] == {"gemm": "gemm.bf16.v1"}


def test_flush_throttled_writes_the_first_calls_then_once_per_interval(tmp_path, monkeypatch):
    monkeypatch.setenv(counters.ENV_DIR, str(tmp_path))
    now = [100.0]
    monkeypatch.setattr(counters.time, "monotonic", lambda: now[0])
    c = counters.Counters()
    written = []
    for step in range(6):
        c.add("linear")
        written.append(c.flush_throttled(every_s=1.0, first=3) is not None)
    assert written == [True, True, True, False, False, False]
    now[0] += 1.0
    c.add("linear")
    assert c.flush_throttled(every_s=1.0, first=3) is not None
    assert counters.read(str(tmp_path))[0]["counts"]["linear"] == 7
