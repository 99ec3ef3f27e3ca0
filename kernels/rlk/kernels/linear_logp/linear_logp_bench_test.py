"""The logp benchmark's bookkeeping on the CPU: ratios, workspace columns, the Liger columns and
the fused budget arms, with Triton's interpreter for the kernels and stand-ins for the device
timers and memory counters (the bench itself runs only on the H200). A bench that crashes or
mislabels a column there costs a device call; this catches it here.
"""

import json

import pytest
import torch

from rlk.kernels.linear_logp import linear_logp_bench as B


@pytest.fixture
def fake_device(monkeypatch):
    """do_bench returns a per-arm time that the test can read back; peaks are per-arm too."""
    import triton.testing as tt

    times = iter(range(1, 10_000))
    monkeypatch.setattr(tt, "do_bench", lambda fn, grad_to_none=None, return_mode=None: (fn(), next(times))[1])
    peak = {"mb": 0.0}
    monkeypatch.setattr(B, "_peak_mb", lambda fn: (fn(), peak.__setitem__("mb", peak["mb"] + 1.0), peak["mb"])[2])
    monkeypatch.setattr(B, "H", 64)
    monkeypatch.setattr(B, "ERR_T", 64)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    # The interpreter walks the default segmentation's 18992-column alignment (seconds per call):
    # the tests' small segmentation keeps the arms cheap; the bookkeeping does not depend on it.
    from rlk.kernels.linear_logp import contract

    monkeypatch.setattr(contract, "DEFAULT_SEGMENTATION", (64, 32))  # linear_logp_test.CPU_SEG
    return peak


def test_rows_columns_and_budget_arms(fake_device, tmp_path, monkeypatch):
    monkeypatch.setattr(B, "_liger", lambda: (None, "liger_kernel not importable: test"))
    out = tmp_path / "logp.json"
    B.run([(64, 160)], str(out), rounds=1, dev="cpu", fused_budgets=(0.01, 1.0))
    d = json.loads(out.read_text())
    assert "provenance" in d
    rows = {r["pass"]: r for r in d["rows"]}
    assert set(rows) == {"fwd", "fwd_bwd", "fwd_bwd_fused", "fwd_bwd_fused_main_grad"}
    mg = rows.pop("fwd_bwd_fused_main_grad")
    assert mg["main_grad_equal_unfused"] is True
    assert mg["strict_workspace_mb"] == pytest.approx(mg["strict_peak_mb"] - 64 * B.H * 2 / 2**20)
    assert mg["ratio"] == pytest.approx(mg["strict_us"] / mg["native_us"])
    assert mg["strict_us"] not in (rows["fwd_bwd"]["strict_us"], rows["fwd_bwd_fused"]["strict_us"])
    # megatron's own route to main_grad (native backward, then DDP's add_): its own measurement,
    # its workspace without the d_weight it folded into the buffer.
    assert mg["native_main_grad_us"] not in (mg["native_us"], mg["strict_us"])
    assert mg["ratio_vs_native_main_grad"] == pytest.approx(mg["strict_us"] / mg["native_main_grad_us"])
    assert mg["workspace_ratio_vs_native_main_grad"] == pytest.approx(
        mg["strict_workspace_mb"] / mg["native_main_grad_workspace_mb"])
    for r in rows.values():
        assert r["ratio"] == pytest.approx(r["strict_us"] / r["native_us"])
        out_mb = B._out_mb("fwd" if r["pass"] == "fwd" else "fwd_bwd", 64, 160)
        assert r["strict_workspace_mb"] == pytest.approx(r["strict_peak_mb"] - out_mb)
        assert r["workspace_ratio"] == pytest.approx(r["strict_workspace_mb"] / r["native_workspace_mb"])
    assert rows["fwd_bwd"]["liger_skipped"].startswith("liger_kernel not importable")
    fused = rows["fwd_bwd_fused"]
    assert fused["native_us"] == rows["fwd_bwd"]["native_us"]  # same native arm, same process
    assert fused["grads_equal_unfused"] is True
    assert [v["ROWS_BUDGET_MB"] for v in fused["budget_variants"]] == [0.01, 1.0]
    times = {fused["strict_us"], rows["fwd_bwd"]["strict_us"], *(v["us"] for v in fused["budget_variants"])}
    assert len(times) == 4, "each budget arm must be its own measurement"
    for v in fused["budget_variants"]:
        assert v["workspace_mb"] == pytest.approx(v["peak_mb"] - B._out_mb("fwd_bwd", 64, 160))
    assert rows["fwd"]["strict_logp_max_abs_err_fp64"] < 1e-3


def test_out_mb_and_budget_override():
    assert B._out_mb("fwd", 1024, 37984) == pytest.approx(1024 * 4 / 2**20)
    assert B._out_mb("fwd_bwd", 1024, 37984) == pytest.approx((1024 + 37984) * B.H * 2 / 2**20)
    from rlk.kernels.linear_logp import schedule

    seen = []
    B._with_budget(lambda: seen.append(schedule.table("cpu-interpreter")["fused"]["ROWS_BUDGET_MB"]), 7.0)()
    assert seen == [7.0]
    assert schedule.table("cpu-interpreter")["fused"]["ROWS_BUDGET_MB"] != 7.0


def test_variants_merge_fields_parse_and_refuse_bad_text(capsys):
    """linear_logp_variants --merge-cfg: 'NAME=INT,...' strings become merge-entry overrides ('' the
    table's own); a malformed one stops the command before any GPU work (exit status 2)."""
    from rlk.kernels.linear_logp import linear_logp_variants as LV

    assert LV.parse_fields("") == {} and LV.parse_fields("table") == {}
    assert LV.parse_fields("BLOCK=64, num_stages=3") == {"BLOCK": 64, "num_stages": 3}
    for bad in ("BLOCK", "BLOCK=", "=3", "num_stages=three"):
        with pytest.raises(ValueError, match="is not NAME=INT"):
            LV.parse_fields(bad)
    with pytest.raises(SystemExit) as e:
        LV.main(["--out", "x.json", "--merge", "16", "--merge-cfg", "", "num_stages=x"])
    assert e.value.code == 2 and "num_stages=x" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a misspelt field would time the table under its label
        LV.main(["--out", "x.json", "--merge", "16", "--merge-cfg", "num_stage=3"])
    assert e.value.code == 2 and "not merge launch fields" in capsys.readouterr().err


def test_variants_log_lines_report_their_rows_byte_checks():
    """The merge and backward rows' log lines read the keys of their own rows (a line reading the
    other pass's keys stops the run at its first row)."""
    from rlk.kernels.linear_logp.linear_logp_variants import bwd_line, merge_line

    bwd = {"pass": "bwd", "T": 64, "V": 37984, "variant": "table", "us": 812.4, "tflops": 70.2, "peak_mb": 310.0,
           "same_dh": True, "same_dw": False}
    assert bwd_line(bwd).startswith("bwd T=    64 table") and bwd_line(bwd).endswith("same=False")

    row = {"pass": "merge", "T": 256, "V": 151936, "segments": 594, "unroll": 16, "merge_cfg": "num_stages=3",
           "graph_us": 41.5, "same_logp": True, "same_lse": False}
    line = merge_line(row)
    assert "T=   256" in line and "S=594" in line and "num_stages=3" in line and line.endswith("same=False")
    assert " table " in merge_line(dict(row, merge_cfg="", same_lse=True))



def test_ddp_accumulate_is_megatrons_hook():
    """The native main_grad arm's step leaves what megatron-core's DDP hook leaves: main_grad plus
    the bf16 weight gradient in fp32, and no weight.grad."""
    w = torch.randn(8, 4).bfloat16().requires_grad_(True)
    (w.float() * torch.randn(8, 4)).sum().backward()
    g = w.grad.clone()
    mg = torch.full((8, 4), 0.5, dtype=torch.float32)
    B.ddp_accumulate(w, mg)
    assert torch.equal(mg, 0.5 + g.float()) and w.grad is None
