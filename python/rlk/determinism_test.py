import os

import pytest

from rlk import determinism


def test_export_sets_variables_and_refuses_contradictions(monkeypatch):
    monkeypatch.delenv("RLK_TEST_VAR", raising=False)
    assert determinism.export({"RLK_TEST_VAR": "x"}) == {"RLK_TEST_VAR": "x"}
    assert os.environ["RLK_TEST_VAR"] == "x"
    monkeypatch.delenv("RLK_TEST_VAR")
    with pytest.raises(ValueError, match="NCCL_NVLS_ENABLE"):
        determinism.export({"NCCL_NVLS_ENABLE": "1"})
    with pytest.raises(ValueError, match="fp_fusion"):
        determinism.export({"TRITON_DEFAULT_FP_FUSION": "1"})


def test_rendezvous_defaults_keep_a_launchers_values(monkeypatch):
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29999")
    got = determinism.single_process_rendezvous_defaults()
    assert got == {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1"}
    assert os.environ["MASTER_PORT"] == "29999"
    monkeypatch.delenv("MASTER_PORT")
    assert int(determinism.single_process_rendezvous_defaults()["MASTER_PORT"]) > 0
    assert determinism.single_process_rendezvous_defaults() == {}
