"""sm90_kscan_probe on the CPU: argument parsing, the least-squares fit and the per-route summary (the
scan itself times CUTLASS kernels and needs an sm_90 GPU with the built library)."""
import pytest

from rlk.kernels.gemm import sm90_kscan_probe


def test_cases_and_ks_parse_and_refuse_what_the_kernels_cannot_take():
    assert sm90_kscan_probe.parse_cases("4096x144, 6144x200") == [(4096, 144), (6144, 200)]
    for bad in ("4096", "4100x144", "4096x0", "", "ax1"):
        with pytest.raises(ValueError, match="sm90_kscan_probe"):
            sm90_kscan_probe.parse_cases(bad)
    assert sm90_kscan_probe.parse_ks("4096,1024,1024") == [1024, 4096]
    for bad in ("1024", "1000,2048", "0,64"):
        with pytest.raises(ValueError, match="multiple of 64"):
            sm90_kscan_probe.parse_ks(bad)


def test_fit_recovers_a_line_and_reports_how_far_points_stray_from_it():
    ks = [1024, 2048, 4096, 8192]
    f = sm90_kscan_probe.fit_line(ks, [0.005 + 0.002 * k / 1024 for k in ks])  # 5 us + 2 us per 1024 K
    assert f["fixed_us"] == pytest.approx(5.0) and f["per_1024k_us"] == pytest.approx(2.0)
    assert f["max_rel_residual"] == pytest.approx(0.0, abs=1e-12)
    bent = sm90_kscan_probe.fit_line(ks, [0.007, 0.009, 0.013, 0.030])
    assert bent["max_rel_residual"] > 0.05
    with pytest.raises(ValueError):
        sm90_kscan_probe.fit_line([1024, 1024], [0.1, 0.2])


def test_summary_compares_each_route_with_cublas_and_leaves_out_a_differing_configuration():
    ks = [1024, 2048, 4096]

    def t(fixed, per_k, k, hidden=0.0):  # back to back, part of the fixed cost may hide under the neighbour
        return {"ms": fixed - hidden + per_k * k / 1024, "separated_ms": fixed + per_k * k / 1024}

    def point(k):
        return {"K": k, "cublas": t(0.004, 0.001, k, hidden=0.002), "triton": t(0.004, 0.002, k),
                "configs": {"slow_fixed": {**t(0.008, 0.001, k), "differing": 0},
                            "wrong": {"ms": 0.001, "separated_ms": 0.001, "differing": 3 if k == 2048 else 0}}}

    doc = {"cases": [{"N": 4096, "M": 144, "points": [point(k) for k in ks]}]}
    sep = {r["route"]: r for r in sm90_kscan_probe.summarize(doc, "separated_ms")}
    assert sep["slow_fixed"]["fixed_over_cublas"] == pytest.approx(2.0) and sep["cublas"]["fixed_us"] == pytest.approx(4.0)
    rows = {r["route"]: r for r in sm90_kscan_probe.summarize(doc)}
    assert rows["cublas"]["fixed_us"] == pytest.approx(2.0) and rows["cublas"]["timing"] == "ms"
    assert sorted(rows) == ["cublas", "slow_fixed", "triton"]
    assert rows["slow_fixed"]["fixed_over_cublas"] == pytest.approx(4.0)
    assert rows["slow_fixed"]["per_k_over_cublas"] == pytest.approx(1.0)
    assert rows["triton"]["per_k_over_cublas"] == pytest.approx(2.0)
    # 4096 rows x 1024 K x 2 bytes per 1 us: 8.39 TB/s.
    assert rows["cublas"]["weight_stream_tb_s"] == pytest.approx(4096 * 1024 * 2 / 1e-6 / 1e12)


def test_scan_times_every_route_at_every_k_and_fits_it_on_the_cpu(monkeypatch):
    """The whole scan on tiny shapes through the Triton interpreter (no configuration: the CUTLASS
    library needs an sm_90 GPU): both timings per route and K, then one fit per route and timing."""
    import torch

    from rlk.kernels.gemm import sm90, sm90_probe

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(sm90_probe, "kernel_names", lambda fn: [])
    monkeypatch.setattr(sm90, "available", lambda name: False)
    doc = sm90_kscan_probe.scan([(16, 2)], [64, 128], ["sw64x72m2"], device="cpu")
    assert doc["skipped_configs"] == ["sw64x72m2"] and [p["K"] for p in doc["cases"][0]["points"]] == [64, 128]
    for p in doc["cases"][0]["points"]:
        assert set(p["cublas"]) == set(p["triton"]) == {"ms", "separated_ms"} and p["configs"] == {}
    fits = sm90_kscan_probe.summarize(doc) + sm90_kscan_probe.summarize(doc, "separated_ms")
    assert sorted((f["timing"], f["route"]) for f in fits) == [("ms", "cublas"), ("ms", "triton"),
                                                              ("separated_ms", "cublas"), ("separated_ms", "triton")]
