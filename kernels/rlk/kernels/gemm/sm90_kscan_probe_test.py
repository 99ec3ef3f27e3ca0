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

    from rlk.kernels.gemm import launch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(sm90_probe, "kernel_names", lambda fn: [])
    monkeypatch.setattr(sm90, "available", lambda name: False)
    gemm, modes = launch.gemm, set()

    def triton_gemm(x, w):  # the "triton" route and the bytes reference: the CUTLASS route must be off
        modes.add(sm90.mode())
        return gemm(x, w)

    monkeypatch.setattr(launch, "gemm", triton_gemm)
    monkeypatch.setenv(sm90.MODE_ENV, "auto")
    doc = sm90_kscan_probe.scan([(16, 2)], [64, 128], ["sw64x72m2"], device="cpu")
    assert modes == {"off"} and sm90.mode() == "auto", modes
    assert doc["skipped_configs"] == ["sw64x72m2"] and [p["K"] for p in doc["cases"][0]["points"]] == [64, 128]
    for p in doc["cases"][0]["points"]:
        assert set(p["cublas"]) == set(p["triton"]) == {"ms", "separated_ms"} and p["configs"] == {}
    fits = sm90_kscan_probe.summarize(doc, min_k=64) + sm90_kscan_probe.summarize(doc, "separated_ms", min_k=64)
    with pytest.raises(ValueError, match="fewer than two K >= 1024"):
        sm90_kscan_probe.summarize(doc)
    assert sorted((f["timing"], f["route"]) for f in fits) == [("ms", "cublas"), ("ms", "triton"),
                                                              ("separated_ms", "cublas"), ("separated_ms", "triton")]


def test_fits_use_only_the_k_run_where_cublas_ran_one_kernel(tmp_path):
    """cuBLAS switches kernels along K (here a wider tile at 8192, split K at 12288): every route is
    fitted over the longest run with one cuBLAS kernel, so the baseline line is one kernel's; a
    saved scan is fitted again the same way without a GPU (--from-json)."""
    import json

    def point(k, kernels):
        t = {"ms": 0.003 + 0.003 * k / 1024, "separated_ms": 0.003 + 0.003 * k / 1024}
        return {"K": k, "cublas": t if k <= 4096 else {"ms": 1.0, "separated_ms": 1.0}, "triton": t,
                "cublas_kernels": kernels, "configs": {"c": {**t, "differing": 0}}}

    pts = [point(1024, ["a"]), point(2048, ["a"]), point(4096, ["a"]), point(8192, ["b"]), point(12288, ["s", "r"])]
    assert [p["K"] for p in sm90_kscan_probe.same_cublas_run(pts)] == [1024, 2048, 4096]
    assert [p["K"] for p in sm90_kscan_probe.same_cublas_run([pts[3], pts[4]])] == [8192, 12288]  # no run: all
    doc = {"cases": [{"N": 4096, "M": 144, "points": pts}]}
    cb = next(f for f in sm90_kscan_probe.summarize(doc) if f["route"] == "cublas")
    assert cb["ks"] == [1024, 2048, 4096] and cb["cublas_kernels"] == ["a"]
    assert cb["per_1024k_us"] == pytest.approx(3.0) and cb["max_rel_residual"] == pytest.approx(0.0, abs=1e-9)
    (tmp_path / "scan.json").write_text(json.dumps(doc))
    assert sm90_kscan_probe.main(["--from-json", str(tmp_path / "scan.json"), "--out", str(tmp_path / "fits.json")]) == 0
    fits = json.loads((tmp_path / "fits.json").read_text())["fits"]
    assert {f["route"] for f in fits} == {"cublas", "triton", "c"} and all(f["ks"] == [1024, 2048, 4096] for f in fits)


def test_fits_leave_out_the_short_k_where_a_call_is_mostly_fixed_cost(tmp_path):
    """K below the fit's minimum (1024 unless --fit-min-k) are timed and kept in the scan but left
    out of the line: there a call is pipeline fill and epilogue, not yet linear in K."""
    import json

    def point(k):
        fill = 0.002 if k < 1024 else 0.0  # short K: more than the line predicts
        t = {"ms": 0.003 + fill + 0.003 * k / 1024, "separated_ms": 0.003 + fill + 0.003 * k / 1024}
        return {"K": k, "cublas": t, "triton": t, "cublas_kernels": ["a"], "configs": {}}

    doc = {"cases": [{"N": 4096, "M": 144, "points": [point(k) for k in (64, 256, 1024, 2048, 4096)]}]}
    cb = next(f for f in sm90_kscan_probe.summarize(doc) if f["route"] == "cublas")
    assert cb["ks"] == [1024, 2048, 4096] and cb["fixed_us"] == pytest.approx(3.0)
    assert cb["max_rel_residual"] == pytest.approx(0.0, abs=1e-9)
    every = next(f for f in sm90_kscan_probe.summarize(doc, min_k=64) if f["route"] == "cublas")
    assert every["ks"] == [64, 256, 1024, 2048, 4096] and every["max_rel_residual"] > 0.1
    (tmp_path / "scan.json").write_text(json.dumps(doc))
    out = tmp_path / "fits.json"
    assert sm90_kscan_probe.main(["--from-json", str(tmp_path / "scan.json"), "--out", str(out), "--fit-min-k", "64"]) == 0
    got = json.loads(out.read_text())
    assert got["fit_min_k"] == 64 and all(f["ks"][0] == 64 for f in got["fits"])


def test_a_k_list_the_fits_cannot_use_is_refused_before_the_scan(tmp_path, monkeypatch):
    """Fewer than two K at or above --fit-min-k: the scan would end with nothing to fit, after its
    GPU time, so it is refused before any timing."""
    monkeypatch.setattr(sm90_kscan_probe, "scan", lambda *a, **k: pytest.fail("scanned"))
    with pytest.raises(SystemExit):
        sm90_kscan_probe.main(["--out", str(tmp_path / "o.json"), "--k", "64,256,1024", "--configs", "sw64x80"])
    with pytest.raises(SystemExit):
        sm90_kscan_probe.main(["--out", str(tmp_path / "o.json"), "--k", "1024,2048", "--fit-min-k", "4096",
                               "--configs", "sw64x80"])


def test_a_configuration_that_does_not_serve_a_k_is_recorded_there_and_the_scan_goes_on(monkeypatch, tmp_path):
    """A 128-deep tile at a K of odd 64-chunk count (K 64 here): the library refuses the call, so
    the scan records the point as not served and times everything else, at that K too; the CLI
    names such points before the scan and refuses unknown configuration names."""
    import torch

    from rlk.errors import UnsupportedConfigError
    from rlk.kernels.gemm import launch, sm90, sm90_probe

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(sm90_probe, "kernel_names", lambda fn: [])
    monkeypatch.setattr(sm90, "available", lambda name: True)
    calls = []

    def gemm_into(y, x, w, name):  # the library's own refusal, then the contract's bytes
        if not sm90.serves_k(name, x.shape[1]):
            raise UnsupportedConfigError(f"sm90 {name}: odd chunk count")
        calls.append((name, x.shape[1]))
        y.copy_(launch.gemm(x, w))

    monkeypatch.setattr(sm90, "gemm_into", gemm_into)
    doc = sm90_kscan_probe.scan([(16, 2)], [64, 128], ["sw64x72x128w", "sw64x72w"], device="cpu")
    at = {p["K"]: p["configs"] for p in doc["cases"][0]["points"]}
    assert at[64]["sw64x72x128w"] == {"not_served": sm90_kscan_probe.NOT_SERVED}
    assert at[64]["sw64x72w"]["differing"] == 0 and at[128]["sw64x72x128w"]["differing"] == 0
    assert {"ms", "separated_ms"} <= set(at[128]["sw64x72x128w"]) and ("sw64x72x128w", 64) not in calls
    fits = {f["route"] for f in sm90_kscan_probe.summarize(doc, min_k=64)}
    assert fits == {"cublas", "triton", "sw64x72w"}  # the 128-deep tile lacks a point of the run

    monkeypatch.setattr(sm90_kscan_probe, "scan", lambda *a, **k: pytest.fail("scanned"))
    with pytest.raises(SystemExit):
        sm90_kscan_probe.main(["--out", str(tmp_path / "o.json"), "--k", "1024,2048", "--configs", "sw64x72,nope"])


def test_the_cli_names_unserved_points_before_the_scan_and_fits_the_rest(tmp_path, monkeypatch, capsys):
    """``main`` says which (configuration, K) will not be timed before any GPU work, and a scan
    whose points hold ``not_served`` entries is fitted and written with exit status 0."""
    import json

    said_before = []

    def fake_scan(cases, ks, configs, pad_m=0):
        said_before.append("not served, so not timed" in capsys.readouterr().out)
        pts = []
        for k in ks:
            t = {"ms": 0.003 + 0.003 * k / 1024, "separated_ms": 0.003 + 0.003 * k / 1024}
            pts.append({"K": k, "cublas": t, "triton": t, "cublas_kernels": ["a"],
                        "configs": {"sw64x72w": {**t, "differing": 0},
                                    "sw64x72x128w": ({"not_served": sm90_kscan_probe.NOT_SERVED} if k == 1088
                                                     else {**t, "differing": 0})}})
        return {"cases": [{"N": cases[0][0], "M": cases[0][1], "points": pts}]}

    monkeypatch.setattr(sm90_kscan_probe, "scan", fake_scan)
    out = tmp_path / "o.json"
    rc = sm90_kscan_probe.main(["--out", str(out), "--cases", "4096x144", "--k", "1024,1088,2048",
                                "--configs", "sw64x72w,sw64x72x128w"])
    assert rc == 0 and said_before == [True]
    fits = {f["route"] for f in json.loads(out.read_text())["fits"]}
    assert fits == {"cublas", "triton", "sw64x72w"}


def test_padded_token_rows_keep_the_bytes_and_are_timed_with_and_without_the_copies(monkeypatch, tmp_path):
    """``pad_m``: each configuration whose token tile divides ``pad_m`` also runs on token rows
    padded with zeros to a multiple of it ('+pad': copies in and out inside the timed call;
    '+padded': the GEMM alone on the padded buffers). The kept rows must carry the reference's
    bytes; a kernel whose rows change with M is recorded as differing and not timed; a swapped
    configuration (token tile 72) is not padded; an M already a multiple gets no padded routes."""
    import torch

    from rlk.kernels.gemm import gemm_tune, launch, sm90, sm90_probe

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(sm90_probe, "kernel_names", lambda fn: [])
    monkeypatch.setattr(sm90, "available", lambda name: True)
    timing, seen, calls = [False], [], [0]

    def bench_ms(fn):  # every timed call runs once here, marked as timed; times grow so none is 0
        timing[0] = True
        fn()
        timing[0] = False
        calls[0] += 1
        return 1.0 + calls[0]

    def gemm_into(y, x, w, name):
        seen.append({"name": name, "rows": x.shape[0], "y_rows": y.shape[0], "timed": timing[0],
                     "tail_zero": bool((x[3:].float() == 0).all()) if x.shape[0] > 3 else None})
        y.copy_(launch.gemm(x, w))
        if name == "ws64x96" and x.shape[0] % 64 == 0:  # a kernel whose rows depend on M
            y.add_(1.0)

    monkeypatch.setattr(gemm_tune, "bench_ms", bench_ms)
    monkeypatch.setattr(sm90, "gemm_into", gemm_into)
    doc = sm90_kscan_probe.scan([(16, 3)], [64, 128], ["ws64x128", "ws64x96", "sw64x72w"], device="cpu", pad_m=64)
    assert doc["pad_m"] == 64
    at3 = doc["cases"][0]["points"][0]["configs"]
    assert at3["ws64x128+pad64"]["differing"] == 0 and at3["ws64x128+pad64"]["padded_m"] == 64
    assert {"ms", "separated_ms"} <= set(at3["ws64x128+pad64"]) and {"ms", "separated_ms"} <= set(at3["ws64x128+padded64"])
    padded_timed = [c for c in seen if c["name"] == "ws64x128" and c["timed"] and c["rows"] == 64]
    # +pad and +padded each timed back to back and separated at both K: 8 timed GEMMs over 64 rows
    assert len(padded_timed) == 8 and all(c["y_rows"] == 64 and c["tail_zero"] for c in padded_timed)
    assert at3["ws64x96+pad64"]["differing"] > 0 and "ms" not in at3["ws64x96+pad64"]
    assert "ws64x96+padded64" not in at3
    assert "not_padded" in at3["sw64x72w+pad64"] and not any(c["name"] == "sw64x72w" and c["rows"] == 64 for c in seen)
    at64 = sm90_kscan_probe.scan([(16, 64)], [64, 128], ["ws64x128", "ws64x96", "sw64x72w"], device="cpu",
                                 pad_m=64)["cases"][0]["points"][0]["configs"]
    assert set(at64) == {"ws64x128", "ws64x96", "sw64x72w"}  # M 64 is a multiple of 64: nothing to pad
    fits = {f["route"] for f in sm90_kscan_probe.summarize(doc, min_k=64)}
    assert {"ws64x128+pad64", "ws64x128+padded64"} <= fits and "ws64x96+pad64" not in fits
    assert sm90_kscan_probe.padded_rows(144, 64) == 192 and sm90_kscan_probe.padded_rows(144, 0) == 144
    assert sm90_kscan_probe.token_tile("sw64x72w") == 72 and sm90_kscan_probe.token_tile("ws64x128") == 64
    with pytest.raises(ValueError, match="pad_m"):
        sm90_kscan_probe.scan([(16, 3)], [64, 128], ["ws64x128"], device="cpu", pad_m=-64)
    monkeypatch.setattr(sm90_kscan_probe, "scan", lambda *a, **k: pytest.fail("scanned"))
    for bad in ("12", "-64"):
        with pytest.raises(SystemExit):
            sm90_kscan_probe.main(["--out", str(tmp_path / "o.json"), "--k", "1024,2048", "--configs", "ws64x128",
                                   "--pad-m", bad])
    (tmp_path / "s.json").write_text("{}")
    with pytest.raises(SystemExit):
        sm90_kscan_probe.main(["--from-json", str(tmp_path / "s.json"), "--out", str(tmp_path / "o.json"), "--pad-m", "64"])
