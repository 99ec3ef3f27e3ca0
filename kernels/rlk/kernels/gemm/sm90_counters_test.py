"""sm90_counters on the CPU: ncu's raw CSV read in base units and split into cases at the marker
fills (no GPU, no ncu: a CSV laid out as ``ncu --import R --csv --page raw`` prints it)."""

import json

import pytest

from rlk.kernels.gemm import sm90_counters as sc

FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, ...>"
CUTLASS = "void cutlass::device_kernel<GemmUniversal<...>>(Params)"
GEMV = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x128x64"
SPLITK = "void cublasLt::splitKreduce_kernel<32, 16, int, float>"

HEADER = ('"ID","Process ID","Kernel Name","Grid Size","gpu__time_duration.sum","dram__bytes_read.sum",'
          '"lts__t_sector_hit_rate.pct","launch__grid_size",'
          '"smsp__average_warp_latency_issue_stalled_barrier.ratio","smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio"')
UNITS = '"","","","","usecond","Mbyte","%","","",""'


def row(i, name, us, mb, hit="50", grid="96", bar="0", lsb="0"):
    return f'"{i}","7","{name}","(96, 1, 1)","{us}","{mb}","{hit}","{grid}","{bar}","{lsb}"'


def csv_text(rows):
    return "\n".join(["==PROF== Connected to process 7", "sm90_counters: ws64x128 M=144 launched", HEADER, UNITS, *rows])


ORDER = [{"route": "ws64x128", "M": 144, "N": 4096, "K": 4096},
         {"route": "cublas", "M": 144, "N": 4096, "K": 4096}]


def test_rows_are_read_in_base_units_and_split_into_cases_at_the_marker_fills():
    text = csv_text([row(0, FILL, "1.5", "0.001"),
                     row(1, CUTLASS, "25.5", "33.554432", hit="40.5", bar="1.25", lsb="0.5"),
                     row(2, FILL, "1.5", "0.001"),
                     row(3, GEMV, "18,000.0", "34.0", hit="60", grid="132"),
                     row(4, SPLITK, "2", "1.0", grid="64")])
    cases = sc.group_cases(sc.read_csv(text), ORDER)
    assert [c["route"] for c in cases] == ["ws64x128", "cublas"]
    a, b = cases
    assert a["kernels"] == [CUTLASS]
    assert a["time_us"] == pytest.approx(25.5)
    assert a["dram_read_bytes"] == pytest.approx(33.554432e6)
    assert a["dram_read_over_weights"] == pytest.approx(1.0)  # 4096 x 4096 x 2 bytes
    assert a["stalls"] == {"barrier": 1.25, "long_scoreboard": 0.5}
    # cuBLAS's two kernels are summed where they add up, and the rates come from the longer one.
    assert b["kernels"] == [GEMV, SPLITK]
    assert b["time_us"] == pytest.approx(18002.0)
    assert b["dram_read_bytes"] == pytest.approx(35.0e6)
    assert b["l2_hit_pct"] == pytest.approx(60.0) and b["grid_size"] == 132


def test_cases_that_do_not_line_up_with_the_launch_order_are_refused():
    one_marker = csv_text([row(0, FILL, "1", "0"), row(1, CUTLASS, "25", "33")])
    with pytest.raises(ValueError, match="1 marker fills in ncu's rows, 2 cases launched"):
        sc.group_cases(sc.read_csv(one_marker), ORDER)
    empty_case = csv_text([row(0, FILL, "1", "0"), row(1, FILL, "1", "0"), row(2, GEMV, "18", "34")])
    with pytest.raises(ValueError, match="has no kernel after its marker"):
        sc.group_cases(sc.read_csv(empty_case), ORDER)
    before = csv_text([row(0, CUTLASS, "25", "33"), row(1, FILL, "1", "0"), row(2, FILL, "1", "0")])
    with pytest.raises(ValueError, match="came before the first marker fill"):
        sc.group_cases(sc.read_csv(before), ORDER)
    with pytest.raises(ValueError, match="no ncu raw-page header"):
        sc.read_csv("==PROF== Disconnected\n")


def test_an_import_with_scaled_units_reads_as_the_base_units(tmp_path):
    scaled = HEADER + "\n" + UNITS.replace("usecond", "msecond").replace("Mbyte", "Kbyte") + "\n" + "\n".join(
        [row(0, FILL, "0.001", "0"), row(1, CUTLASS, "0.0255", "32768"), row(2, FILL, "0.001", "0"),
         row(3, GEMV, "0.018", "33000")])
    (tmp_path / "c.csv").write_text(scaled)
    (tmp_path / "o.json").write_text(json.dumps({"device": "H100", "library": {"sha256": "ab"}, "cases": ORDER}))
    assert sc.main(["report", "--csv", str(tmp_path / "c.csv"), "--order", str(tmp_path / "o.json"),
                    "--out", str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["library"] == {"sha256": "ab"}
    assert doc["cases"][0]["time_us"] == pytest.approx(25.5)
    assert doc["cases"][0]["dram_read_bytes"] == pytest.approx(32.768e6)
    assert doc["cases"][1]["time_us"] == pytest.approx(18.0)
    with pytest.raises(ValueError, match="unit 'furlong-second' not understood"):
        sc.read_csv(HEADER + "\n" + UNITS.replace("usecond", "furlong-second") + "\n" + row(0, FILL, "1", "0"))
