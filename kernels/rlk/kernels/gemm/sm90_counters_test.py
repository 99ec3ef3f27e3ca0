"""sm90_counters on the CPU: ncu's raw CSV read in base units and split into cases at the marker
fills (no GPU, no ncu: a CSV laid out as ``ncu --import R --csv --page raw`` prints it)."""

import json

import pytest

from rlk.kernels.gemm import sm90_counters as sc

FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, ...>"
CUTLASS = "void cutlass::device_kernel<GemmUniversal<...>>(Params)"
GEMV = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x128x64"
SPLITK = "void cublasLt::splitKreduce_kernel<32, 16, int, float>"
BF16_FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>, ...>"

# Column names and units as ncu 2025.3 printed them on the H100 (--print-units base).
HEADER = ('"ID","Process ID","Kernel Name","Grid Size","gpu__time_duration.sum","dram__bytes.sum.per_second",'
          '"lts__t_sector_hit_rate.pct","launch__grid_size",'
          '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
          '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"')
UNITS = '"","","","","ns","byte/s","%","","inst","inst"'


def row(i, name, ns, rate, hit="50", grid="96", bar="0", lsb="0"):
    return f'"{i}","7","{name}","(96, 1, 1)","{ns}","{rate}","{hit}","{grid}","{bar}","{lsb}"'


def csv_text(rows, units=UNITS):
    return "\n".join(["==PROF== Connected to process 7", "sm90_counters: ws64x128 M=144 launched", HEADER, units, *rows])


ORDER = [{"route": "ws64x128", "M": 144, "N": 4096, "K": 4096},
         {"route": "cublas", "M": 144, "N": 4096, "K": 4096}]
WEIGHTS = 4096 * 4096 * 2


def test_rows_are_read_in_base_units_and_split_into_cases_at_the_marker_fills():
    text = csv_text([row(0, FILL, "1,500", "1,000,000"),
                     row(1, CUTLASS, "25,000", "1,342,177,280,000", hit="40.5", bar="1.25", lsb="0.5"),
                     row(2, FILL, "1,500", "1,000,000"),
                     row(3, SPLITK, "2,000", "500,000,000,000", hit="10", grid="64"),
                     row(4, GEMV, "18,000", "2,000,000,000,000", hit="60", grid="132"),
                     row(5, BF16_FILL, "1,000", "0")])  # another fill is a kernel of the case, not a marker
    cases = sc.group_cases(sc.read_csv(text), ORDER)
    assert [c["route"] for c in cases] == ["ws64x128", "cublas"]
    a, b = cases
    assert a["kernels"] == [CUTLASS]
    assert a["time_us"] == pytest.approx(25.0)
    assert a["dram_bytes"] == pytest.approx(1.34217728e12 * 25e-6)  # rate x duration
    assert a["dram_bytes_over_weights"] == pytest.approx(1.0)
    assert a["weight_tb_s"] == pytest.approx(WEIGHTS / 25e-6 / 1e12)
    assert a["stalls"] == {"barrier": 1.25, "long_scoreboard": 0.5}
    # cuBLAS's two kernels: times and bytes add up; rates and shares come from the longer one.
    assert b["kernels"] == [SPLITK, GEMV, BF16_FILL]
    assert b["time_us"] == pytest.approx(21.0)
    assert b["dram_bytes"] == pytest.approx(5e11 * 2e-6 + 2e12 * 18e-6)
    assert b["l2_hit_pct"] == pytest.approx(60.0) and b["grid_size"] == 132


def test_cases_that_do_not_line_up_with_the_launch_order_are_refused():
    one_marker = csv_text([row(0, FILL, "1", "0"), row(1, CUTLASS, "25", "33")])
    with pytest.raises(ValueError, match="1 marker fills in ncu's rows, 2 cases launched"):
        sc.group_cases(sc.read_csv(one_marker), ORDER)
    # Two fills per case (the marker bug seen on the device) gives more markers than cases.
    two_fills = csv_text([row(0, FILL, "1", "0"), row(1, FILL, "1", "0"), row(2, CUTLASS, "25", "33"),
                          row(3, FILL, "1", "0"), row(4, FILL, "1", "0"), row(5, GEMV, "18", "34")])
    with pytest.raises(ValueError, match="4 marker fills in ncu's rows, 2 cases launched"):
        sc.group_cases(sc.read_csv(two_fills), ORDER)
    empty_case = csv_text([row(0, FILL, "1", "0"), row(1, FILL, "1", "0"), row(2, GEMV, "18", "34")])
    with pytest.raises(ValueError, match="has no kernel after its marker"):
        sc.group_cases(sc.read_csv(empty_case), ORDER)
    before = csv_text([row(0, CUTLASS, "25", "33"), row(1, FILL, "1", "0"), row(2, FILL, "1", "0")])
    with pytest.raises(ValueError, match="came before the first marker fill"):
        sc.group_cases(sc.read_csv(before), ORDER)
    # A configuration's case holds cuBLAS's kernel: the rows are shifted, not the configuration's.
    swapped = csv_text([row(0, FILL, "1", "0"), row(1, GEMV, "18", "34"), row(2, FILL, "1", "0"), row(3, CUTLASS, "25", "33")])
    with pytest.raises(ValueError, match="should be one CUTLASS kernel"):
        sc.group_cases(sc.read_csv(swapped), ORDER)
    no_time = csv_text([row(0, FILL, "1", "0"), row(1, CUTLASS, "", "33"), row(2, FILL, "1", "0"), row(3, GEMV, "18", "34")])
    with pytest.raises(ValueError, match="without gpu__time_duration.sum"):
        sc.group_cases(sc.read_csv(no_time), ORDER)
    short_row = csv_text([row(0, FILL, "1", "0"), '"1","7","' + CUTLASS + '"'])
    with pytest.raises(ValueError, match="a row of 3 fields under a header of 10"):
        sc.read_csv(short_row)
    with pytest.raises(ValueError, match="no ncu raw-page header"):
        sc.read_csv("==PROF== Disconnected\n")


def test_an_import_with_scaled_units_reads_as_the_base_units(tmp_path):
    scaled = csv_text([row(0, FILL, "0.0015", "1"), row(1, CUTLASS, "0.025", "1,342.17728"), row(2, FILL, "0.0015", "1"),
                       row(3, GEMV, "0.018", "2,000")], units=UNITS.replace('"ns"', '"msecond"').replace("byte/s", "Gbyte/s"))
    (tmp_path / "c.csv").write_text(scaled)
    (tmp_path / "o.json").write_text(json.dumps({"device": "H100", "library": {"sha256": "ab"}, "cases": ORDER}))
    assert sc.main(["report", "--csv", str(tmp_path / "c.csv"), "--order", str(tmp_path / "o.json"),
                    "--out", str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["library"] == {"sha256": "ab"} and doc["device"] == "H100"
    assert doc["cases"][0]["time_us"] == pytest.approx(25.0)
    assert doc["cases"][0]["dram_bytes_over_weights"] == pytest.approx(1.0)
    assert doc["cases"][1]["time_us"] == pytest.approx(18.0)
    assert doc["sampling"] == "one launch per case, clocks unlocked"
    # A unit the report computes with and cannot scale is refused; other columns pass as printed.
    with pytest.raises(ValueError, match="dram__bytes.sum.per_second in unit 'furlong/s': not understood"):
        sc.read_csv(csv_text([row(0, FILL, "1", "1")], units=UNITS.replace("byte/s", "furlong/s")))
    with pytest.raises(ValueError, match="gpu__time_duration.sum in unit 'fortnight'"):
        sc.read_csv(csv_text([row(0, FILL, "1", "1")], units=UNITS.replace('"ns"', '"fortnight"')))
    other = sc.read_csv(csv_text([row(0, FILL, "1", "1", hit="7")], units=UNITS.replace('"%"', '"cycle/nsecond"')))
    assert other[0]["metrics"]["lts__t_sector_hit_rate.pct"] == 7.0
    # The CLI says what is wrong and exits 2 on an input it refuses.
    (tmp_path / "bad.csv").write_text(csv_text([row(0, FILL, "1", "0")]))
    assert sc.main(["report", "--csv", str(tmp_path / "bad.csv"), "--order", str(tmp_path / "o.json"),
                    "--out", str(tmp_path / "r2.json")]) == 2
    assert not (tmp_path / "r2.json").exists()
