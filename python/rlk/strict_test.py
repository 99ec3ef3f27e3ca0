import json
import os

import pytest
import torch

from rlk import contracts, strict
from rlk.errors import ContractMismatchError, ExactnessError, ProvenanceError, UnsupportedConfigError

BITS = dict(dtypes={"in": "bf16"}, accumulation="fp32", rounding="RNE at store", reduction_order="ascending",
            fp_fusion=False)


@pytest.fixture(autouse=True)
def fake_registry(monkeypatch):
    monkeypatch.setattr(contracts, "_REGISTRY", {})
    contracts.register(contracts.Contract(id="gemm.bf16.v1", summary="g", bit_fields=BITS))
    contracts.register(contracts.Contract(id="gemm.bf16.v2", summary="g2", bit_fields=BITS))
    contracts.register(contracts.Contract(
        id="attn.v2", summary="a", bit_fields={**BITS, "head_dims": [64, 128], "page_sizes": [16, 64]}))
    contracts.register(contracts.Contract(id="logp.v2", summary="l", bit_fields=BITS))


def cfg(**kw):
    kw.setdefault("ops", ("gemm", "attention", "logp"))
    return strict.StrictConfig(**kw)


def test_valid_plan_names_contracts_and_is_active_only_inside():
    assert strict.current_plan() is None
    with strict.strict_mode(cfg(head_dim=128, page_size=16), load=False) as plan:
        assert strict.current_plan() is plan
        assert plan.contracts == {"gemm": "gemm.bf16.v1", "attention": "attn.v2", "logp": "logp.v2"}
        assert plan.contract("attention").id == "attn.v2"
    assert strict.current_plan() is None


@pytest.mark.parametrize("kw, match", [
    (dict(dtype="float16"), "dtype"),
    (dict(head_dim=96), "head_dim 96"),
    (dict(page_size=8), "page_size 8"),
    (dict(tp=0), "tp must be"),
    (dict(ops=("gemm", "conv")), "unknown op"),
    (dict(contracts={"conv": "conv.v1"}), "unknown ops"),
])
def test_unsupported_configs_raise_when_plan_is_built(kw, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        strict.build_plan(cfg(**kw), load=False)


def test_unknown_or_foreign_contract_ids_raise():
    with pytest.raises(ContractMismatchError, match="unknown contract"):
        strict.build_plan(cfg(contracts={"gemm": "gemm.bf16.v9"}), load=False)
    with pytest.raises(ContractMismatchError, match="not one for op 'gemm'"):
        strict.build_plan(cfg(contracts={"gemm": "logp.v2"}), load=False)


def test_peer_with_other_contract_version_is_rejected():
    plan = strict.build_plan(cfg(), load=False)
    plan.check_peer({"gemm": "gemm.bf16.v1", "logp": "logp.v2"}, "rollout")
    with pytest.raises(ContractMismatchError, match="gemm"):
        plan.check_peer({"gemm": "gemm.bf16.v2"}, "rollout")


def test_stale_weight_generation_raises():
    plan = strict.build_plan(cfg(), load=False)
    plan.check_generation(0)
    plan.bump_weight_generation()
    with pytest.raises(ProvenanceError, match="stale weight generation 0"):
        plan.check_generation(0)


def test_exactness_failure_writes_diagnostic(tmp_path):
    plan = strict.build_plan(cfg(diag_dir=str(tmp_path)), load=False)
    a = torch.tensor([1.0, 2.0, 3.0])
    plan.verify_equal(a, a.clone(), "same")
    b = a.clone()
    b[2] = torch.nextafter(b[2], torch.tensor(10.0))
    with pytest.raises(ExactnessError, match=r"first at \(2,\)") as ei:
        plan.verify_equal(b, a, "logp step 3")
    path = str(ei.value).split("diagnostic: ")[1].rstrip(")")
    body = json.load(open(path))
    assert body["what"] == "logp step 3" and "1 of 3 elements differ" in body["error"]
    assert os.path.dirname(path) == str(tmp_path)


def test_environment_contradicting_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(UnsupportedConfigError, match="NCCL_NVLS_ENABLE"):
        strict.build_plan(cfg(), load=False)
