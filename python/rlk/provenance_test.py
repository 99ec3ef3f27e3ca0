import json

import pytest

from rlk import provenance
from rlk.errors import ProvenanceError


@pytest.fixture(scope="module")
def rec():
    return provenance.capability_record(route="strict", extra={"model": "tiny"}, load_contracts=False)


def test_record_has_the_fields_that_change_bits(rec):
    for key in ("device", "toolchain", "contracts", "kernel_sources", "tuning_tables", "environment", "image"):
        assert key in rec
    assert rec["toolchain"]["torch"] and rec["toolchain"]["triton"]
    assert rec["toolchain"]["value_checks"] in ("device", "host", "off")
    assert len(rec["fingerprint"]) == 64


def test_same_inputs_same_fingerprint(rec):
    again = provenance.capability_record(route="strict", extra={"model": "tiny"}, load_contracts=False)
    assert again["fingerprint"] == rec["fingerprint"]


@pytest.mark.parametrize("path", [("route",), ("toolchain", "triton"), ("device", "name"), ("extra", "model"),
                                  ("image", "tag"), ("environment", "TRITON_INTERPRET")])
def test_any_changed_field_changes_fingerprint(rec, path):
    other = json.loads(json.dumps(rec))
    node = other
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = "changed"
    assert provenance.fingerprint(other) != rec["fingerprint"]


def test_volatile_fields_do_not_count(rec):
    other = dict(rec, created_at="1970-01-01T00:00:00+00:00")
    assert provenance.fingerprint(other) == rec["fingerprint"]


def test_json_round_trip_and_tamper_detection(rec):
    text = provenance.dumps(rec)
    assert provenance.loads(text) == rec
    bad = json.loads(text)
    bad["toolchain"]["torch"] = "0.0"
    with pytest.raises(ProvenanceError, match="fingerprint"):
        provenance.loads(json.dumps(bad))
    with pytest.raises(ProvenanceError, match="schema"):
        provenance.loads(json.dumps({**rec, "schema": "other"}))


def test_image_fields_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RLK_IMAGE_TAG", "rlk-cpu:0.1.0")
    monkeypatch.setenv("RLK_IMAGE_DIGEST", "sha256:abc")
    r = provenance.capability_record(load_contracts=False)
    assert r["image"] == {"tag": "rlk-cpu:0.1.0", "digest": "sha256:abc"}


def test_paired_arms_may_differ_only_in_route(rec):
    native = provenance.capability_record(route="native", extra={"model": "tiny"}, load_contracts=False)
    provenance.require_paired(rec, native)
    other = provenance.capability_record(route="native", extra={"model": "other"}, load_contracts=False)
    with pytest.raises(ProvenanceError, match="extra.model"):
        provenance.require_paired(rec, other)


def test_record_carries_compiled_kernel_fingerprints():
    r = provenance.capability_record(load_contracts=True)
    ck = r["compiled_kernels"]
    assert "error" not in ck, ck
    assert ck["kernels"] and all(len(v) == 64 for v in ck["kernels"].values())
    only = provenance.capability_record(contract_ids=["gemm.bf16.v1"])["compiled_kernels"]["kernels"]
    assert set(only) and all(k.startswith("gemm.") for k in only)


def test_toolchain_versions_come_from_distribution_metadata():
    import importlib.metadata

    t = provenance.toolchain()
    for key, dist in (("numpy", "numpy"), ("safetensors", "safetensors"), ("megatron.core", "megatron-core")):
        try:
            want = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            assert key not in t
            continue
        # megatron.core's own __version__ appends the git HEAD of the checkout it runs in.
        assert t[key] == want, (key, t[key], want)


def test_gemm_table_override_is_recorded(tmp_path, monkeypatch):
    from rlk import provenance

    t = tmp_path / "tuned.json"
    t.write_text("{}")
    monkeypatch.delenv("RLK_GEMM_TABLE", raising=False)
    assert not any(k.startswith("env:") for k in provenance.tuning_table_hashes())
    monkeypatch.setenv("RLK_GEMM_TABLE", str(t))
    rec = provenance.tuning_table_hashes()["env:RLK_GEMM_TABLE"]
    assert rec.startswith(str(t)) and "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" in rec
    monkeypatch.setenv("RLK_GEMM_TABLE", str(tmp_path / "gone.json"))
    assert provenance.tuning_table_hashes()["env:RLK_GEMM_TABLE"].endswith("(missing)")
