"""Both routes implement ``RouteOps`` with its parameter names; only the strict route offers the
fused LM-head loss."""

from __future__ import annotations

import inspect

import pytest

from rlk.models.qwen3 import routes


def _params(fn):
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _protocol_methods():
    return [n for n, v in vars(routes.RouteOps).items() if callable(v) and not n.startswith("_")]


@pytest.mark.parametrize("cls", [routes.StrictOps, routes.NativeOps], ids=["strict", "native"])
def test_route_implements_the_op_set_with_its_parameter_names(cls):
    names = _protocol_methods()
    assert len(names) == 17
    for n in names:
        want = _params(getattr(routes.RouteOps, n))
        got = _params(getattr(cls, n))
        # A route may add trailing optional parameters (strict attn_paged's out=), nothing else.
        assert got[:len(want)] == want, f"{cls.__name__}.{n}{tuple(got)} differs from RouteOps {tuple(want)}"
        extra = inspect.signature(getattr(cls, n)).parameters
        assert all(extra[p].default is not inspect.Parameter.empty for p in got[len(want):]), (cls.__name__, n)


def test_isinstance_and_the_fused_capability():
    native = routes.NativeOps()
    assert isinstance(native, routes.RouteOps)
    assert not isinstance(native, routes.FusedLossOps)
    assert "logp_loss" in vars(routes.StrictOps) and isinstance(object.__new__(routes.StrictOps), routes.FusedLossOps)


def test_a_drifting_route_is_caught():
    class Drifted(routes.NativeOps):
        def apply_rope(self, x, positions, inv_freq):  # the old native parameter name
            return x

    with pytest.raises(AssertionError, match="apply_rope"):
        test_route_implements_the_op_set_with_its_parameter_names(Drifted)


def test_strict_contract_ids_come_from_the_one_map():
    from rlk import contracts

    assert routes.StrictOps.contracts == {"gemm": "gemm.bf16.v1", "rmsnorm": "rmsnorm.v1", "rope": "rope.v1",
                                          "swiglu": "swiglu.v1", "embedding": "embedding.v1",
                                          "attention": "attn.v2", "linear_logp": "logp.v2"}
    assert all(contracts.STRICT_CONTRACTS[k] == v for k, v in routes.StrictOps.contracts.items())
    assert set(routes.NativeOps.contracts) == set(routes.MODEL_OPS)


def test_every_strict_contract_id_is_registered():
    from rlk import contracts

    contracts.load_all()
    for op, cid in contracts.STRICT_CONTRACTS.items():
        assert contracts.get(cid).id == cid, op  # ContractMismatchError for an unknown ID
