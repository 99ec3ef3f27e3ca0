import pytest

from rlk import contracts
from rlk.errors import ContractMismatchError

BITS = dict(dtypes={"in": "bf16", "acc": "fp32", "out": "bf16"}, accumulation="fp32 tl.dot",
            rounding="one RNE at store", reduction_order="K chunks of 64 ascending", fp_fusion=False)


@pytest.fixture(autouse=True)
def empty_registry(monkeypatch):
    monkeypatch.setattr(contracts, "_REGISTRY", {})


def make(cid="toy.bf16.v1", **over):
    kw = dict(id=cid, summary="toy", bit_fields=dict(BITS))
    kw.update(over)
    return contracts.Contract(**kw)


def test_well_formed_contract_registers_and_is_frozen():
    c = contracts.register(make())
    assert contracts.get("toy.bf16.v1") is c
    assert c.op == "toy" and c.version == 1
    with pytest.raises(TypeError):
        c.bit_fields["rounding"] = "other"  # frozen mapping
    with pytest.raises(Exception):
        c.id = "x.v2"


@pytest.mark.parametrize("cid", ["toy", "Toy.v1", "toy.v", "toy.bf16.v1x", ""])
def test_malformed_id_rejected(cid):
    with pytest.raises(ContractMismatchError, match="id must look like"):
        make(cid)


@pytest.mark.parametrize("field", contracts.REQUIRED_BIT_FIELDS)
def test_missing_required_field_rejected(field):
    bits = dict(BITS)
    del bits[field]
    with pytest.raises(ContractMismatchError, match=field):
        make(bit_fields=bits)


def test_fusion_must_be_pinned():
    with pytest.raises(ContractMismatchError, match="fp_fusion"):
        make(bit_fields={**BITS, "fp_fusion": "default"})


def test_schedule_field_needs_evidence_and_cannot_be_bit_field():
    with pytest.raises(ContractMismatchError, match="no bit-neutrality evidence"):
        make(schedule_fields={"num_warps": [4, 8]})
    ok = make(schedule_fields={"num_warps": [4, 8]}, bit_neutral_evidence={"num_warps": "sweep@sm_90"})
    assert ok.schedule_fields["num_warps"] == (4, 8)
    with pytest.raises(ContractMismatchError, match="both bit-relevant and free"):
        make(schedule_fields={"rounding": [1]}, bit_neutral_evidence={"rounding": "x"})


def test_unknown_id_and_double_registration():
    with pytest.raises(ContractMismatchError, match="unknown contract"):
        contracts.get("nope.v1")
    contracts.register(make())
    contracts.register(make())  # same content: fine
    with pytest.raises(ContractMismatchError, match="registered twice"):
        contracts.register(make(summary="different"))


def test_mixing_ids_between_sides_is_an_error():
    contracts.require_same({"gemm": "gemm.bf16.v1"}, {"gemm": "gemm.bf16.v1"})
    with pytest.raises(ContractMismatchError, match="gemm: trainer=gemm.bf16.v1 rollout=gemm.bf16.v2"):
        contracts.require_same({"gemm": "gemm.bf16.v1"}, {"gemm": "gemm.bf16.v2"}, ("trainer", "rollout"))
    with pytest.raises(ContractMismatchError, match="attn"):
        contracts.require_same({"attn": "attn.v2"}, {})


def test_lock_catches_unversioned_bit_change():
    c1 = contracts.register(make())
    lock = contracts.lock_json()
    assert contracts.check_lock(lock) == []
    changed = make(bit_fields={**BITS, "reduction_order": "K chunks of 128 ascending"})
    assert changed.bit_hash() != c1.bit_hash()
    assert contracts.check_lock(lock, [changed]) == ["toy.bf16.v1: bit fields changed without a new version"]
    # Schedule fields are free: changing them keeps the hash.
    sched = make(schedule_fields={"BLOCK_M": [16, 64]}, bit_neutral_evidence={"BLOCK_M": "sweep"})
    assert sched.bit_hash() == c1.bit_hash()
    assert "not in the lock" in contracts.check_lock({}, [c1])[0]
    assert contracts.check_lock({**lock, "old.v1": "x"}, [c1]) == ["old.v1: in the lock but not registered"]


def test_to_json_round_trips_fields():
    c = make(schedule_fields={"BLOCK_M": [16]}, bit_neutral_evidence={"BLOCK_M": "sweep"})
    j = c.to_json()
    back = contracts.Contract(id=j["id"], summary=j["summary"], bit_fields=j["bit_fields"],
                              schedule_fields=j["schedule_fields"],
                              bit_neutral_evidence=j["bit_neutral_evidence"], targets=j["targets"])
    assert back == c and back.bit_hash() == j["bit_hash"]
