"""sm90_probe's analysis, on synthetic probe rows (CPU): tables and their default rule, twin
comparisons (cuBLAS's own tile, epilogue, schedule, tile K), cuBLAS kernel names, stored probes."""

from __future__ import annotations

import json

import pytest

from rlk.kernels.gemm import sm90, sm90_probe


def _row(name, K, N, M, triton, **cfg):
    return {"shape": name, "K": K, "N": N, "M": M, "triton_ms": triton,
            "configs": {c: ({"ms": v, "differing": 0} if v > 0 else {"ms": -v, "differing": 3})
                        for c, v in cfg.items()}}


def test_make_table_picks_the_fastest_that_beats_triton_and_never_one_that_differs():
    rows = [_row("a", 64, 128, 64, 1.0, pp64x96=1.2, co128x96=1.1),    # Triton fastest -> null
            _row("a", 64, 128, 128, 1.0, pp64x96=0.9, co128x96=0.8),   # co128x96
            _row("a", 64, 128, 256, 1.0, pp64x96=0.7, co128x96=-0.1),  # fastest differs: pp64x96
            _row("b", 64, 256, 64, 1.0, pp64x96=0.9, co128x96=1.3),
            _row("b", 64, 256, 128, 1.0, pp64x96=0.95, co128x96=0.9),
            _row("b2", 64, 256, 128, 1.0, pp64x96=0.85, co128x96=1.0),  # same K x N: times add up
            _row("b", 64, 256, 256, 1.0, pp64x96=0.9, co128x96=0.5)]
    t = sm90_probe.make_table({"rows": rows, "device": "x", "timing": "y", "library": {}}, "src")
    assert t["entries"]["64x128"] == [[64, None], [128, "co128x96"], [None, "pp64x96"]]
    assert t["entries"]["64x256"] == [[128, "pp64x96"], [None, "co128x96"]]
    # default: geometric mean over both K x N; at M 64 pp64x96 (sqrt(1.2 * 0.9) > 1) loses to Triton
    assert t["default"] == [[64, None], [128, "co128x96"], [None, "pp64x96"]]


def test_the_default_rule_never_picks_a_configuration_that_loses_to_triton_at_a_probed_shape():
    # pp64x96: geometric mean sqrt(0.5 * 1.1) = 0.74, the best, but slower than Triton at "b";
    # co128x96 beats Triton at both shapes: the rule takes it. Entries still pick per shape.
    rows = [_row("a", 64, 128, 64, 1.0, pp64x96=0.5, co128x96=0.9),
            _row("b", 64, 256, 64, 1.0, pp64x96=1.1, co128x96=0.95),
            _row("a", 64, 128, 128, 1.0, pp64x96=0.5, co128x96=1.2),
            _row("b", 64, 256, 128, 1.0, pp64x96=1.1, co128x96=0.9)]
    t = sm90_probe.make_table({"rows": rows, "device": "x", "timing": "y", "library": {}}, "src")
    assert t["default"] == [[64, "co128x96"], [None, None]]
    assert t["entries"] == {"64x128": [[None, "pp64x96"]], "64x256": [[None, "co128x96"]]}


def test_a_table_from_some_shapes_scores_the_others_under_its_default_rule():
    rows = [{**_row("a", 64, 128, M, 1.0, pp64x96=0.8, co128x96=0.9), "cublas_ms": 0.5} for M in (64, 128)]
    rows += [{**_row("held", 64, 512, 64, 1.0, pp64x96=1.25, co128x96=0.9), "cublas_ms": 2.0},
             {**_row("held", 64, 512, 128, 1.0, pp64x96=-0.5, co128x96=0.9), "cublas_ms": 2.0}]
    doc = {"rows": rows, "device": "x", "timing": "y", "library": {}}
    t = sm90_probe.make_table(doc, "src", shapes={"a"})
    assert t["shapes"] == ["a"] and "64x512" not in t["entries"] and t["default"] == [[None, "pp64x96"]]
    ev = sm90_probe.evaluate_table(doc, t, "t.json")
    held = [r for r in ev["rows"] if r["shape"] == "held"]
    # M 64: the rule's pick is 25% slower than Triton there (a cliff, reported); M 128: the pick
    # gave other bytes at that shape: a bad pick, never scored as a time.
    assert [(r["M"], r["rule"], r["pick"], r["route_vs_triton"], r["route_vs_cublas"]) for r in held] == \
        [(64, "default", "pp64x96", 1.25, 0.625)]
    assert ev["summary"]["default"]["rows_slower_than_triton"] == 1
    assert ev["summary"]["entry"]["route_vs_triton_max"] == 0.8
    assert [(b["shape"], b["M"], b["pick"]) for b in ev["bad_picks"]] == [("held", 128, "pp64x96")]


def test_leave_one_out_scores_each_shape_under_the_rule_built_without_it():
    # At M 64 pp64x96 has the best geometric mean over Triton on any two shapes, but loses at "c":
    # the geomean rule serves "c" with it (slower than Triton there), beats_all never does.
    t = {"a": (0.5, 0.9), "b": (0.6, 0.9), "c": (1.3, 0.95)}
    rows = [{**_row(n, 64, 128 * (i + 1), 64, 1.0, pp64x96=pp, co128x96=co), "cublas_ms": 1.0}
            for i, (n, (pp, co)) in enumerate(t.items())]
    doc = {"rows": rows, "device": "x", "timing": "y", "library": {}}
    strict, loose = (sm90_probe.leave_one_out(doc, {"a", "b", "c"}, r) for r in ("beats_all", "geomean"))
    assert set(strict["held_out"]) == {"64x128", "64x256", "64x384"} and strict["total"]["rows"] == 3
    # held-out "c": the beats_all rule built from a, b alone takes pp64x96 too (it beat Triton at
    # both): one slow row; held-out "a" / "b": built with "c", beats_all takes co128x96.
    assert strict["held_out"]["64x384"]["route_vs_triton_max"] == 1.3
    assert strict["held_out"]["64x128"]["route_vs_triton_max"] == 0.9
    assert loose["held_out"]["64x128"]["route_vs_triton_max"] == 0.5
    assert strict["total"]["rows_slower_than_triton"] == loose["total"]["rows_slower_than_triton"] == 1
    with pytest.raises(ValueError, match="rule"):
        sm90_probe.make_table(doc, "src", rule="fastest")


def test_merged_probes_take_each_shape_from_the_first_probe_that_has_it():
    lib = {"sha256": "L"}
    a = {"device": "d", "timing": "t", "library": lib,
         "rows": [{**_row("a", 64, 128, M, 1.0, pp64x96=0.5), "differing_total": 0} for M in (16, 32, 48)]}
    b = {"device": "d", "timing": "t", "library": lib,
         "rows": [{**_row(n, 64, 128 if n == "a" else 256, 32, 1.0, pp64x96=2.0), "differing_total": 0}
                  for n in ("a", "b")]}
    m = sm90_probe.merge_probes([a, b])
    assert [(r["shape"], r["M"]) for r in m["rows"]] == [("a", 16), ("a", 32), ("a", 48), ("b", 32)]
    assert m["merged_from"] == [3, 1]
    # entries from every shape; the default rule from "a" alone takes pp64x96 (it loses at "b")
    t = sm90_probe.make_table(m, "src", rule_shapes={"a"})
    assert t["entries"] == {"64x128": [[None, "pp64x96"]], "64x256": [[None, None]]}
    assert t["default"] == [[None, "pp64x96"]] and t["rule_shapes"] == ["a"]
    assert sm90_probe.make_table(m, "src")["default"] == [[None, None]]
    with pytest.raises(SystemExit, match="libraries"):
        sm90_probe.merge_probes([a, {**b, "library": {"sha256": "other"}}])


def test_entries_from_another_table_replace_only_the_k_x_n_it_has(tmp_path):
    table = {"entries": {"64x128": [[None, "pp64x96"]], "64x256": [[None, None]]}, "default": [[32, "pp64x128"]]}
    other = {"entries": {"64x128": [[16, None], [None, "co128x96"]], "8x8": [[None, None]]},
             "default": [[None, "co128x256"]]}
    out = sm90_probe.overlay_entries(table, other, "before.json", "abc")
    assert out["entries"] == {"64x128": [[16, None], [None, "co128x96"]], "64x256": [[None, None]], "8x8": [[None, None]]}
    assert out["default"] == table["default"]  # the rule stays the probe's
    assert out["entries_from"] == {"table": "before.json", "sha256": "abc", "kn": ["64x128", "8x8"]}
    assert table["entries"]["64x128"] == [[None, "pp64x96"]]  # the input is not changed
    only = sm90_probe.overlay_entries(table, other, "before.json", "abc", kns={"64x128"})
    assert only["entries"] == {"64x128": [[16, None], [None, "co128x96"]], "64x256": [[None, None]]}
    assert only["entries_from"]["kn"] == ["64x128"]
    with pytest.raises(SystemExit, match="no entry"):
        sm90_probe.overlay_entries(table, {"default": []}, "empty.json", "0")
    with pytest.raises(SystemExit, match="64x256"):
        sm90_probe.overlay_entries(table, other, "before.json", "abc", kns={"64x256"})


def test_shape_names_expand_groups_and_refuse_unknown_names():
    names = sm90_probe.shape_names("qkv,other,qkv")
    assert names[0] == "qkv" and names.count("qkv") == 1 and "14b_down" in names and "o" not in names
    assert sm90_probe.shape_names("8b") == list(sm90_probe.QWEN3_8B_GEMMS)
    with pytest.raises(SystemExit, match="unknown shape"):
        sm90_probe.shape_names("qkv,nope")


def test_runs_merges_equal_neighbours_and_opens_the_last_bucket():
    assert sm90_probe._runs([(1, None), (8, None), (64, "a"), (128, "a"), (256, None)]) == \
        [[8, None], [128, "a"], [None, None]]
    assert sm90_probe._runs([]) == []


def test_cublas_k_split_reads_the_kernel_names():
    """The probe's ``cublas_k``: cuBLAS's sm_90 kernels name their K decomposition; a split-K fold
    kernel or ``segment_k_on`` is a split, ``segment_k_off`` alone is one walk, anything else
    is unknown (never guessed)."""
    on = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x128x64_warpgroupsize1x1x1_execute_segment_k_on_kernel__5x_cublas"
    off = on.replace("segment_k_on", "segment_k_off")
    assert sm90_probe.cublas_k_split([on]) == "split"
    assert sm90_probe.cublas_k_split([off]) == "single"
    assert sm90_probe.cublas_k_split([off, "void cublasLt::splitKreduce_kernel<32, 16, int, float>"]) == "split"
    assert sm90_probe.cublas_k_split(["nvjet_hsh_128x64_64x4_1x2_h_bz_TNT"]) == "unknown"
    assert sm90_probe.cublas_k_split([]) == "unknown"


def test_cublas_tile_reads_the_nvjet_kernel_name_as_a_swapped_configuration():
    """nvjet names give tile, K chunk, stages and cluster; cuBLAS computes y^T, so the first side
    runs along the weight rows and the second along the tokens: the name of a swapped
    configuration here, and of the unswapped one where wgmma can take the tokens on its M side
    (names as cuBLAS 13's kernels printed them on an H100)."""
    reduce = "void cublasLt::splitKreduce_kernel<32, 16, int, float>"
    t = sm90_probe.cublas_tile(["nvjet_sm90_tst_64x72_64x12_2x1_v_bz_TNT"])
    assert t["weight_rows"] == 64 and t["tokens"] == 72 and t["stages"] == 12 and t["k_chunk"] == 64, t
    assert t["cluster"] == [2, 1] and t["as_config"] == "sw64x72m2" and t["in_library"] and not t["split_k"], t
    t = sm90_probe.cublas_tile([reduce, "nvjet_sm90_tst_128x80_64x8_1x2_h_bz_splitK_TNT"])
    assert t["as_config"] == "sw128x80n2" and t["split_k"] and t["in_library"], t
    t = sm90_probe.cublas_tile(["Memset (Device)", "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT"])
    assert t["as_config"] == "sw192x128n2" and t["as_unswapped"] == "co128x192m2" and t["in_library"], t
    t = sm90_probe.cublas_tile(["nvjet_sm90_tst_144x64_64x8_2x1_v_bz_TNN"])
    assert t["as_unswapped"] == "pp64x144n2" and t["in_library"], t
    t = sm90_probe.cublas_tile(["nvjet_sm90_tst_288x128_64x4_2x1_v_bz_coopA_TNN"])
    assert t["as_config"] == "sw288x128m2" and t["as_unswapped"] is None and not t["in_library"], t
    t = sm90_probe.cublas_tile(["nvjet_sm90_tst_160x192_64x4_4x1_v_bz_coopB_TNN"])
    assert t["as_unswapped"] is None and not t["in_library"], t
    assert sm90_probe.cublas_tile(["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"]) is None
    assert sm90_probe.cublas_tile([]) is None


def test_cublas_twins_time_cublas_own_tile_against_cublas():
    """Rows whose nvjet tile the library holds (swapped or unswapped name) give that
    configuration's time over cuBLAS's; rows above max_m, without an nvjet kernel, or where the
    twin was not timed are left out."""
    def row(M, kernel, configs, cublas_ms=1.0):
        return {"shape": "o", "M": M, "cublas_ms": cublas_ms, "cublas_kernels": [kernel] if kernel else [],
                "configs": configs}

    doc = {"rows": [
        row(144, "nvjet_sm90_tst_64x80_64x11_2x1_v_bz_TNT", {"sw64x80m2": {"ms": 2.0}, "pp64x96": {"ms": 0.5}}),
        row(256, "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT", {"co128x192m2": {"ms": 0.45}}, cublas_ms=0.5),
        row(1024, "nvjet_sm90_tst_64x80_64x11_2x1_v_bz_TNT", {"sw64x80m2": {"ms": 9.0}}),
        row(16, "nvjet_sm90_tst_64x80_64x11_2x1_v_bz_TNT", {"sw64x80m2": {"error": "launch"}}),
        row(32, None, {"sw64x80m2": {"ms": 9.0}}),
    ]}
    tw = sm90_probe.cublas_twins(doc)
    assert (tw["rows"], tw["at_or_under_cublas"]) == (2, 1), tw
    assert [(t["M"], t["config"]) for t in tw["per_row"]] == [(144, "sw64x80m2"), (256, "co128x192m2")]
    assert tw["min"] == pytest.approx(0.9) and tw["max"] == 2.0, tw
    assert sm90_probe.cublas_twins({"rows": []}) == {"max_m": 512, "rows": 0, "at_or_under_cublas": 0, "per_row": []}


def test_direct_pairs_time_each_direct_epilogue_against_its_tma_twin():
    """A direct-epilogue configuration is compared with the same name without its ``d`` at rows
    where both ran (M <= max_m): a row where either is missing or failed, or above max_m, is left out."""
    def row(M, configs, cublas_ms=1.0):
        return {"shape": "o", "M": M, "cublas_ms": cublas_ms, "configs": configs}

    doc = {"rows": [
        row(144, {"sw64x72m2d": {"ms": 0.6}, "sw64x72m2": {"ms": 1.2}}),
        row(160, {"sw64x72m2d": {"ms": 1.5}, "sw64x72m2": {"ms": 1.0}}, cublas_ms=0.5),
        row(176, {"sw64x72m2d": {"ms": 0.5}, "sw64x72m2": {"error": "launch"}}),
        row(1024, {"sw64x72m2d": {"ms": 0.1}, "sw64x72m2": {"ms": 1.0}}),
        row(192, {"sw64x80d": {"ms": 1.0}}),
    ]}
    dp = sm90_probe.direct_pairs(doc)
    assert sorted(dp["configs"]) == ["sw64x72m2d"], dp
    d = dp["configs"]["sw64x72m2d"]
    assert (d["twin"], d["rows"], d["direct_faster_rows"]) == ("sw64x72m2", 2, 1), d
    assert (d["min"], d["max"]) == (pytest.approx(0.5), pytest.approx(1.5)), d
    assert d["per_row"][1]["direct_vs_cublas"] == pytest.approx(3.0) and d["per_row"][1]["tma_vs_cublas"] == 2.0
    assert sm90_probe.direct_pairs({"rows": []}) == {"max_m": 512, "configs": {}}


def test_read_json_reads_plain_and_xz_probes_alike(tmp_path):
    """docs/results keeps large probe JSON xz-compressed; --from-json reads it as the plain file."""
    import lzma

    doc = {"rows": [{"shape": "o", "M": 1}], "seconds": 1.5}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with lzma.open(tmp_path / "p.json.xz", "wt") as f:
        json.dump(doc, f)
    assert sm90_probe.read_json(str(tmp_path / "p.json")) == sm90_probe.read_json(str(tmp_path / "p.json.xz")) == doc
    (tmp_path / "bad.json.xz").write_text(json.dumps(doc))  # plain text under an .xz name is refused
    with pytest.raises(lzma.LZMAError):
        sm90_probe.read_json(str(tmp_path / "bad.json.xz"))


def test_schedule_pairs_time_each_non_persistent_configuration_against_its_ping_pong_twin():
    """A non-persistent configuration (coop 2) is compared with the one whose fields differ only in
    the schedule (coop 0: "sw64x72m2w" with "sw64x72m2", "ws64x96" with "pp64x96", "sw64x72m2wd"
    with "sw64x72m2d"), never with a twin that differs in anything else (the epilogue)."""
    def row(M, configs):
        return {"shape": "o", "M": M, "cublas_ms": 1.0, "configs": configs}

    doc = {"rows": [
        row(144, {"sw64x72m2w": {"ms": 0.8}, "sw64x72m2": {"ms": 1.0}, "sw64x72m2wd": {"ms": 0.9},
                  "sw64x72m2d": {"ms": 0.6}, "ws64x96": {"ms": 2.0}, "pp64x96": {"ms": 1.0}}),
        row(640, {"sw64x72m2w": {"ms": 0.1}, "sw64x72m2": {"ms": 1.0}}),
    ]}
    sp = sm90_probe.schedule_pairs(doc)
    got = {n: (d["twin"], d["rows"], d["nonpersistent_faster_rows"], d["min"]) for n, d in sp["configs"].items()}
    assert got == {"sw64x72m2w": ("sw64x72m2", 1, 1, pytest.approx(0.8)),
                   "sw64x72m2wd": ("sw64x72m2d", 1, 0, pytest.approx(1.5)),
                   "ws64x96": ("pp64x96", 1, 0, pytest.approx(2.0))}, got
    # The direct pairs hold the schedule fixed: the non-persistent direct one's twin is non-persistent.
    assert sm90_probe.direct_pairs(doc)["configs"]["sw64x72m2wd"]["twin"] == "sw64x72m2w"


def test_tile_k_pairs_time_each_128_deep_tile_against_its_64_deep_twin():
    """A 128-deep configuration is compared with the one whose fields differ only in tile K
    ("sw64x72x128m2w" with "sw64x72m2w", "ws64x192x128" with "ws64x192"), never with a twin that
    differs in anything else (the schedule: "sw64x72m2")."""
    def row(M, configs):
        return {"shape": "o", "M": M, "cublas_ms": 2.0, "configs": configs}

    doc = {"rows": [
        row(144, {"sw64x72x128m2w": {"ms": 0.5}, "sw64x72m2w": {"ms": 1.0}, "sw64x72m2": {"ms": 0.1},
                  "ws64x192x128": {"ms": 1.2}, "ws64x192": {"ms": 1.0}}),
        row(200, {"sw64x72x128m2w": {"ms": 3.0}, "sw64x72m2w": {"ms": 2.0}}),
        row(1024, {"ws64x192x128": {"ms": 0.1}, "ws64x192": {"ms": 1.0}}),
    ]}
    kp = sm90_probe.tile_k_pairs(doc)
    got = {n: (d["twin"], d["rows"], d["k128_faster_rows"], d["min"], d["max"]) for n, d in kp["configs"].items()}
    assert got == {"sw64x72x128m2w": ("sw64x72m2w", 2, 1, pytest.approx(0.5), pytest.approx(1.5)),
                   "ws64x192x128": ("ws64x192", 1, 0, pytest.approx(1.2), pytest.approx(1.2))}, got
    assert kp["configs"]["ws64x192x128"]["per_row"][0]["k128_vs_cublas"] == pytest.approx(0.6)
    # Every 128-deep configuration in the library has its 64-deep twin there.
    deep = [n for n, f in sm90.CONFIGS.items() if f[7] == 128]
    assert deep and all((*sm90.CONFIGS[n][:7], 64) in set(sm90.CONFIGS.values()) for n in deep), deep


def test_a_probe_stopped_after_a_shape_keeps_it_and_merges_with_a_probe_of_the_rest(tmp_path, monkeypatch, capsys):
    """The probe's JSON is rewritten after every shape, marked partial with the shapes left: a
    probe cut short (here by an interrupt at the second shape) keeps the first shape's rows, and
    ``--from-json partial,rest`` scores the whole set as one probe."""
    import torch

    from rlk.kernels.gemm import launch

    class Stop(BaseException):
        pass

    monkeypatch.setattr(sm90_probe, "SHAPES", {"tiny_a": (64, 16), "tiny_b": (64, 24), "tiny_c": (128, 32)})
    monkeypatch.setattr(sm90_probe, "kernel_names", lambda fn: [])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(sm90, "library_manifest", lambda: {"sha256": "fake"})
    stop_at = {24}

    def gemm_into(y, x, w, name):
        if w.shape[0] in stop_at:
            raise Stop
        y.copy_(launch.gemm(x, w))

    monkeypatch.setattr(sm90, "gemm_into", gemm_into)
    first, rest = tmp_path / "first.json", tmp_path / "rest.json"
    with pytest.raises(Stop):
        sm90_probe.probe(["tiny_a", "tiny_b", "tiny_c"], [1, 3], ["ws64x128"], str(first), device="cpu")
    got = json.loads(first.read_text())
    assert got["partial"] == {"shapes_done": ["tiny_a"], "shapes_left": ["tiny_b", "tiny_c"]}
    assert [(r["shape"], r["M"]) for r in got["rows"]] == [("tiny_a", 1), ("tiny_a", 3)]
    assert got["differing_total"] == 0 and got["errors"] == []

    stop_at.clear()
    done = sm90_probe.probe(["tiny_b", "tiny_c"], [1, 3], ["ws64x128"], str(rest), device="cpu")
    assert "partial" not in done and json.loads(rest.read_text())["rows"] == json.loads(json.dumps(done["rows"]))
    capsys.readouterr()
    assert sm90_probe.main(["--from-json", str(first), "--out", str(tmp_path / "one.json")]) == 0
    assert "partial probe; shapes not probed: ['tiny_b', 'tiny_c']" in capsys.readouterr().out
    assert sm90_probe.main(["--from-json", f"{first},{rest}", "--out", str(tmp_path / "all.json")]) == 0
    merged = json.loads((tmp_path / "all.json").read_text())
    assert "partial" not in merged and {r["shape"] for r in merged["rows"]} == {"tiny_a", "tiny_b", "tiny_c"}
    assert merged["padded_estimate"]["rows"] == 6  # every probe's JSON prices padded rows (3 shapes x 2 M)


def test_padded_estimate_prices_a_larger_m_of_the_same_shape_up_to_the_next_multiple(tmp_path):
    """A row's padded time is the best route time at any probed M' from M up to M rounded up to
    the pad, over cuBLAS's time at M; a configuration whose bytes differ never counts; rows past
    max_m are left out; the CLI writes the estimate and refuses a missing probe."""
    import json

    from rlk.kernels.gemm import sm90_probe_pairs as pairs

    def row(shape, m, cublas, triton, **configs):
        return {"shape": shape, "M": m, "cublas_ms": cublas, "triton_ms": triton,
                "configs": {n: ({"differing": 0, "ms": t} if t > 0 else {"differing": 5, "ms": -t})
                            for n, t in configs.items()}}

    doc = {"rows": [row("o", 136, 1.0, 1.5, a=1.2),
                    row("o", 176, 2.0, 1.5, a=1.1, b=-0.5),  # b is faster but its bytes differ
                    row("o", 192, 0.95, 1.5, a=0.9),  # cuBLAS at M' is not the baseline: M's is
                    row("o", 200, 1.0, 1.5, a=1.3),
                    row("o", 1024, 1.0, 1.5, a=0.1),
                    row("qkv", 136, 2.0, 1.9, a=2.2),
                    row("qkv", 160, 2.0, 1.9, a=1.6),  # between M and the multiple, the fastest
                    row("qkv", 192, 2.0, 2.5, a=2.0),  # exactly cuBLAS's time: not over
                    row("down", 136, 1.0, 1.5, a=1.1)]}
    est = pairs.padded_estimate(doc, pad=64)
    got = {(r["shape"], r["M"]): r for r in est["per_row"]}
    assert ("o", 1024) not in got and len(got) == 8
    assert got[("o", 136)]["padded_vs_cublas"] == pytest.approx(0.9) and got[("o", 136)]["padded_m"] == 192
    assert got[("o", 176)]["route_vs_cublas"] == pytest.approx(1.1 / 2.0)  # a, not b's 0.5
    assert got[("o", 200)]["padded_m"] == 200  # 256 was not probed and 1024 is past the pad
    assert got[("qkv", 136)]["route_vs_cublas"] == pytest.approx(0.95)  # Triton's 1.9 beats a
    assert got[("qkv", 136)]["padded_vs_cublas"] == pytest.approx(0.8) and got[("qkv", 136)]["padded_m"] == 160
    assert got[("qkv", 136)]["top_vs_cublas"] == pytest.approx(0.95)  # 192's 2.0 is not faster than 136's 1.9
    assert got[("down", 136)]["padded_m"] == 136 and got[("down", 136)]["top_vs_cublas"] == pytest.approx(1.1)
    assert got[("o", 136)]["top_vs_cublas"] == pytest.approx(0.9)
    # over 1: o 136 (1.2), o 200 (1.3), down 136 (1.1); qkv 192 is exactly 1.0 (a's 2.0 / 2.0), not over
    assert est["over_cublas"] == 3 and est["padded_over_cublas"] == 2 and est["top_over_cublas"] == 2
    assert est["padded_rows_used"] == 3  # o 136, o 176 (both at 192), qkv 136 (at 160)
    assert pairs.padded_estimate(doc, pad=8)["per_row"][0]["padded_m"] == 136  # down 136: nothing up to 136
    with pytest.raises(ValueError):
        pairs.padded_estimate(doc, pad=0)
    (tmp_path / "p.json").write_text(json.dumps(doc))
    assert pairs.main(["padded", "--probe", str(tmp_path / "p.json"), "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["padded_over_cublas"] == 2
    assert pairs.main(["padded", "--probe", str(tmp_path / "missing.json"), "--out", str(tmp_path / "f.json")]) == 2
