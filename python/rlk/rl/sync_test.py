"""The weight sync's fingerprint check: a verified copy passes, every corrupted one raises."""

import types

import pytest
import torch

from rlk.errors import ProvenanceError, UnsupportedConfigError
from rlk.rl import sync


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(4, 3, generator=g).to(torch.bfloat16),
            "b.weight": torch.randn(5, generator=g).to(torch.bfloat16)}


def _engine():
    return types.SimpleNamespace(w={k: torch.zeros_like(v) for k, v in _weights().items()}, weight_generation=None)


def test_verified_sync_copies_in_place_and_records_both_digests():
    src, eng = _weights(), _engine()
    ptrs = {k: t.data_ptr() for k, t in eng.w.items()}
    rec = sync.sync_weights(src, eng, generation=3)
    assert rec["match"] and rec["sha256_trainer"] == rec["sha256_rollout"] == sync.fingerprint(src)
    assert rec["bytes"] == 17 * 2 and eng.weight_generation == 3
    assert all(torch.equal(eng.w[k], src[k]) and eng.w[k].data_ptr() == ptrs[k] for k in src)
    sync.check_generation(eng, 3)


def test_fingerprint_sees_one_bit_and_the_dtype():
    w = _weights()
    flipped = {k: v.clone() for k, v in w.items()}
    flipped["b.weight"].view(torch.int16)[2] ^= 1
    assert sync.fingerprint(flipped) != sync.fingerprint(w)
    assert sync.fingerprint({k: v.clone() for k, v in w.items()}) == sync.fingerprint(w)
    assert sync.fingerprint({k: v.float() for k, v in w.items()}) != sync.fingerprint(w)


def test_corrupting_transport_aborts_with_a_diagnostic():
    def one_bit_off(src, dst):
        sync.copy_transport(src, dst)
        dst["b.weight"].view(torch.int16)[2] ^= 1  # a bit flipped in transit

    eng = _engine()
    with pytest.raises(sync.WeightSyncError) as e:
        sync.sync_weights(_weights(), eng, generation=1, transport=one_bit_off)
    msg = str(e.value)
    assert "fingerprint mismatch" in msg and "'tensor': 'b.weight'" in msg and "'first_index': 2" in msg
    assert "'differing_elements': 1" in msg and "a.weight" not in msg
    assert isinstance(e.value, ProvenanceError) and eng.weight_generation is None
    with pytest.raises(sync.WeightSyncError, match="generation None"):
        sync.check_generation(eng, 1)


def test_a_skipped_tensor_is_caught():
    def skip_a(src, dst):
        dst["b.weight"].copy_(src["b.weight"])

    with pytest.raises(sync.WeightSyncError, match="a.weight"):
        sync.sync_weights(_weights(), _engine(), generation=1, transport=skip_a)


def test_stale_generation_is_refused():
    eng = _engine()
    sync.sync_weights(_weights(), eng, generation=4)
    with pytest.raises(sync.WeightSyncError, match="generation 4, the trainer's latest is 5"):
        sync.check_generation(eng, 5)


def test_layout_mismatch_is_a_config_error():
    eng = _engine()
    with pytest.raises(UnsupportedConfigError, match="names differ"):
        sync.sync_weights({"a.weight": _weights()["a.weight"]}, eng, 0)
    bad = _weights()
    bad["b.weight"] = bad["b.weight"].float()
    with pytest.raises(UnsupportedConfigError, match="b.weight"):
        sync.sync_weights(bad, eng, 0)


def test_device_fingerprint_sees_one_bit_shape_and_dtype_and_ignores_chunking(monkeypatch):
    w = _weights()
    d = sync.fingerprint(w, "device")
    assert d == sync.fingerprint({k: v.clone() for k, v in w.items()}, "device")
    for k in w:  # one flipped bit in any word of any tensor changes the digest
        for j in range(w[k].numel()):
            for bit in (0, 15):
                f = {n: v.clone() for n, v in w.items()}
                f[k].view(torch.int16).view(-1)[j] ^= 1 << bit if bit < 15 else -(1 << 15)
                assert sync.fingerprint(f, "device") != d, (k, j, bit)
    assert sync.fingerprint({k: v.float() for k, v in w.items()}, "device") != d
    assert sync.fingerprint({k: v.reshape(-1) for k, v in w.items()}, "device") != d
    # Two words swapped: position multipliers see the order.
    f = {n: v.clone() for n, v in w.items()}
    f["a.weight"].view(-1)[[0, 1]] = f["a.weight"].view(-1)[[1, 0]]
    assert sync.fingerprint(f, "device") != d
    # Chunk boundaries change nothing: the sums are exact modulo a prime.
    monkeypatch.setattr(sync, "_CHUNK_WORDS", 3)
    assert sync.fingerprint(w, "device") == d


def test_sync_with_device_fingerprint_and_a_corrupting_transport():
    src, eng = _weights(), _engine()
    rec = sync.sync_weights(src, eng, generation=1, kind="device")
    assert rec["fingerprint"] == "device" and rec["sha256_trainer"] == rec["sha256_rollout"]

    def bad(s, d):
        sync.copy_transport(s, d)
        d["a.weight"].view(torch.int16).view(-1)[5] ^= 1

    with pytest.raises(sync.WeightSyncError, match="a.weight"):
        sync.sync_weights(src, _engine(), generation=2, transport=bad, kind="device")
    with pytest.raises(UnsupportedConfigError, match="unknown"):
        sync.fingerprint(src, "md5")


def test_tensor_fingerprint_of_views_zeros_signs_and_dtypes(monkeypatch):
    t = torch.randn(1000, 7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    fp = sync.tensor_fingerprint(t)
    assert fp == sync.tensor_fingerprint(t.t().contiguous().t())  # a strided view of the same values
    assert sync.tensor_fingerprint(torch.zeros(5)) != sync.tensor_fingerprint(torch.tensor([0.0, 0.0, -0.0, 0.0, 0.0]))
    assert sync.tensor_fingerprint(torch.zeros(4, dtype=torch.int32)) != sync.tensor_fingerprint(torch.zeros(4))
    g = t.float()
    monkeypatch.setattr(sync, "_CHUNK_WORDS", 13)
    assert sync.tensor_fingerprint(t) == fp and sync.tensor_fingerprint(g) != fp
