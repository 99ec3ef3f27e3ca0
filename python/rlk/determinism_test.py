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


def test_interpret_flag_is_read_once_and_cdiv_matches_triton(monkeypatch):
    """kernels.common.interpret_flag keeps the first answer (Triton fixed interpreter vs compiler
    when the kernels were decorated; the environment is not read again per launch); the host
    cdiv equals triton.cdiv."""
    import triton

    from rlk.kernels import common

    first = common.interpret_flag()
    monkeypatch.setenv("TRITON_INTERPRET", "0" if first else "1")
    assert common.interpret_flag() is first
    assert common.launch_options() == ({} if first else {"enable_fp_fusion": common.FP_FUSION})
    for a in (0, 1, 63, 64, 65, 151936, 2**40 + 3):
        for b in (1, 7, 64, 256):
            assert common.cdiv(a, b) == triton.cdiv(a, b)


def test_scoped_sets_and_drops_then_restores(monkeypatch):
    """Inside ``scoped`` the variables to put are set (with export's checks) and those to drop are
    gone; afterwards each is back as it was, set or unset."""
    monkeypatch.setenv("RLK_TEST_KEEP", "old")
    monkeypatch.setenv("RLK_TEST_DROP", "here")
    monkeypatch.delenv("RLK_TEST_NEW", raising=False)
    with determinism.scoped({"RLK_TEST_KEEP": "new", "RLK_TEST_NEW": "1"}, ["RLK_TEST_DROP"]):
        assert os.environ["RLK_TEST_KEEP"] == "new" and os.environ["RLK_TEST_NEW"] == "1"
        assert "RLK_TEST_DROP" not in os.environ
    assert os.environ["RLK_TEST_KEEP"] == "old" and os.environ["RLK_TEST_DROP"] == "here"
    assert "RLK_TEST_NEW" not in os.environ
    with pytest.raises(ValueError, match="NCCL_NVLS_ENABLE"):
        with determinism.scoped({"NCCL_NVLS_ENABLE": "1"}):
            pass
    assert determinism.unset(["RLK_TEST_DROP", "RLK_TEST_ABSENT"]) == {"RLK_TEST_DROP": "here"}
