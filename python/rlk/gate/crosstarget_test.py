"""Tests of the cross-target static checks (rlk.gate.crosstarget).

Planted kernels (written to a temporary module and compiled, for sm_90 and gfx942, in one clean
subprocess, as the gate does): a good bf16 GEMM tile that passes; a float ``atomic_add``; a
kernel launched with fusion left to the default and compiled with fusion on although its
contract pins it off; a contract naming another MMA form than the one compiled. Each bad one
must be caught. Runs on CPU, no GPU (compilation only, nothing is executed).
"""

from __future__ import annotations

import textwrap

import pytest

from rlk.gate import crosstarget as ct

PLANT = textwrap.dedent(
    '''
    import triton
    import triton.language as tl

    from rlk import contracts
    from rlk.kernels.common import launch_options
    from rlk.kernels.registry import KernelEntry, register_kernel

    BASE = {"dtypes": "bf16 in, fp32 acc, bf16 out", "accumulation": "fp32",
            "rounding": "RNE at store", "reduction_order": "K ascending in BK chunks", "fp_fusion": False}
    GOOD_MMA = {"sm_90": "wgmma.f32.bf16.bf16", "gfx942": "v_mfma_f32_32x32x8_bf16"}


    @triton.jit
    def ct_good(a_ptr, b_ptr, c_ptr, K, scale, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                DOT_DTYPE: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), tl.float32)
        # Reduction order: K in BK chunks, ascending; fp32 accumulator.
        for k in range(0, K, BK):
            a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :]).to(tl.float32)
            b = tl.load(b_ptr + rn[:, None] * K + (k + rk)[None, :]).to(tl.float32)
            acc = tl.dot(a.to(DOT_DTYPE), tl.trans(b.to(DOT_DTYPE)), acc)
        bias = tl.load(c_ptr + rn).to(tl.float32)
        tl.store(c_ptr + rm[:, None] * BN + rn[None, :], (acc * scale + bias[None, :]).to(tl.bfloat16))


    @triton.jit
    def ct_atomic(x_ptr, out_ptr, B: tl.constexpr):
        x = tl.load(x_ptr + tl.arange(0, B))
        tl.atomic_add(out_ptr, tl.sum(x))


    @triton.jit
    def ct_fused(x_ptr, y_ptr, z_ptr, o_ptr, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(o_ptr + o, tl.load(x_ptr + o) * tl.load(y_ptr + o) + tl.load(z_ptr + o))


    @triton.jit
    def ct_default(x_ptr, o_ptr, B: tl.constexpr, SCALE: tl.constexpr = 2):
        o = tl.arange(0, B * SCALE // SCALE)
        tl.store(o_ptr + o, tl.load(x_ptr + o) * SCALE)


    def launch_good(a, b, c, K, scale):
        ct_good[(1,)](a, b, c, K, scale, BM=128, BN=128, BK=64, DOT_DTYPE=tl.bfloat16, **launch_options())


    def launch_fused(x, y, z, o):
        ct_fused[(1,)](x, y, z, o, B=128)


    GEMM_SIG = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "K": "i32", "scale": "fp32"}
    GEMM_CFG = ({"BM": 128, "BN": 128, "BK": 64, "DOT_DTYPE": tl.bfloat16, "num_warps": 8},)
    contracts.register(contracts.Contract("ctgood.v1", "good", dict(BASE, mma_form=GOOD_MMA)))
    contracts.register(contracts.Contract("ctatomic.v1", "atomic", dict(BASE, mma_form="none")))
    contracts.register(contracts.Contract("ctfused.v1", "fused", dict(BASE, mma_form="none")))
    contracts.register(contracts.Contract(
        "ctmma.v1", "wrong mma",
        dict(BASE, mma_form={"sm_90": "mma.sync.m16n8k16.f32.bf16.bf16", "gfx942": "v_mfma_f32_16x16x16_bf16"})))
    contracts.register(contracts.Contract(
        "ctallowed.v1", "two forms allowed",
        dict(BASE, mma_form={"ct.allowed": {"sm_90": ["mma.sync.m16n8k16.f32.bf16.bf16", "wgmma.f32.bf16.bf16"],
                                            "gfx942": ["v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16"]}})))
    register_kernel(KernelEntry("ct.allowed", "ctallowed.v1", ct_good, GEMM_SIG, GEMM_CFG, expects_mma=True))
    register_kernel(KernelEntry("ct.good", "ctgood.v1", ct_good, GEMM_SIG, GEMM_CFG, expects_mma=True))
    register_kernel(KernelEntry("ct.mma", "ctmma.v1", ct_good, GEMM_SIG, GEMM_CFG, expects_mma=True))
    register_kernel(KernelEntry("ct.atomic", "ctatomic.v1", ct_atomic, {"x_ptr": "*fp32", "out_ptr": "*fp32"},
                                ({"B": 128, "num_warps": 4},)))
    contracts.register(contracts.Contract("ctdefault.v1", "a defaulted constexpr", dict(BASE, mma_form="none")))
    register_kernel(KernelEntry("ct.default", "ctdefault.v1", ct_default, {"x_ptr": "*fp32", "o_ptr": "*fp32"},
                                ({"B": 128, "num_warps": 4},)))
    register_kernel(KernelEntry("ct.fused", "ctfused.v1", ct_fused,
                                {"x_ptr": "*fp32", "y_ptr": "*fp32", "z_ptr": "*fp32", "o_ptr": "*fp32"},
                                ({"B": 128, "num_warps": 4, "enable_fp_fusion": True},)))
    '''
)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("ctplant")
    (d / "ct_plant_kernels.py").write_text(PLANT)
    res = ct.compile_all(modules=["ct_plant_kernels"], extra_paths=[str(d)], timeout=600)
    assert not res["import_errors"], res["import_errors"]
    return res


def _recs(res, kernel):
    rs = [r for r in res["records"] if r["kernel"] == kernel]
    assert {r["target"] for r in rs} == {"sm_90", "gfx942"}, rs
    return rs


def test_good_kernel_passes_both_targets(planted):
    for r in _recs(planted, "ct.good"):
        assert r["compiled"], r["error"]
        assert r["problems"] == [], r["problems"]
        assert r["fp_fusion"] is False
        assert r["float_atomics"] == []
        assert len(r["fingerprint"]) == 64
    forms = {r["target"]: r["mma_form"] for r in _recs(planted, "ct.good")}
    assert forms == {"sm_90": "wgmma.f32.bf16.bf16", "gfx942": "v_mfma_f32_32x32x8_bf16"}
    # acc * scale + bias contracts to an FMA when fusion is on: fusion is bit-relevant and was pinned.
    assert all(r["fusion_relevant"] for r in _recs(planted, "ct.good"))
    assert not any("launch of ct_good" in p for p in planted["launch_problems"])


def test_a_constexpr_left_out_compiles_with_its_default(planted):
    """A configuration that does not name a constexpr with a default compiles with that default
    (as a launch would), not with None (``B * SCALE`` would not compile)."""
    for r in _recs(planted, "ct.default"):
        assert r["compiled"] and not r["problems"], r


def test_float_atomic_is_caught(planted):
    for r in _recs(planted, "ct.atomic"):
        assert r["compiled"], r["error"]
        assert any("floating-point atomics" in p for p in r["problems"]), r
    by_t = {r["target"]: r["float_atomics"] for r in _recs(planted, "ct.atomic")}
    assert any(a.startswith("atom.") and ".f32" in a for a in by_t["sm_90"]), by_t
    assert any("atomic_add_f32" in a for a in by_t["gfx942"]), by_t


def test_fusion_left_to_default_is_caught(planted):
    # The launch site passes no launch_options(): the static scan names it.
    assert any("launch of ct_fused leaves fp fusion" in p for p in planted["launch_problems"]), planted
    # The compile (fusion on) contradicts the contract's fp_fusion=False and shows contracted FMAs.
    for r in _recs(planted, "ct.fused"):
        assert r["fp_fusion"] is True and r["fusion_relevant"] is True
        assert any("contract pins fp_fusion=False" in p for p in r["problems"]), r["problems"]
        assert any("contracted FMAs" in p for p in r["problems"]), r["problems"]


def test_different_mma_form_is_caught(planted):
    for r in _recs(planted, "ct.mma"):
        assert any(p.startswith("MMA form") for p in r["problems"]), r["problems"]
        assert len(r["problems"]) == 1, r["problems"]
    # Same function as ct.good: same code, same fingerprint; only the contract differs.
    fp = {(r["target"]): r["fingerprint"] for r in _recs(planted, "ct.good")}
    assert all(r["fingerprint"] == fp[r["target"]] for r in _recs(planted, "ct.mma"))


def test_contract_may_allow_several_forms(planted):
    for r in _recs(planted, "ct.allowed"):
        assert r["problems"] == [], r["problems"]


def test_problem_summary_and_golden_roundtrip(planted):
    probs = ct.problems(planted)
    for k in ("ct.atomic", "ct.fused", "ct.mma"):
        assert any(p.startswith(k + " ") for p in probs), k
    assert not any(p.startswith(("ct.good ", "ct.allowed ")) for p in probs)
    golden = ct.golden_from(planted)
    assert ct.compare_golden(planted, golden) == []
    key = next(k for k in golden["fingerprints"] if "|ct.good|" in k)
    changed = dict(golden, fingerprints=dict(golden["fingerprints"], **{key: "0" * 64}))
    diff = ct.compare_golden(planted, changed)
    assert len(diff) == 1 and ct.REQUALIFY in diff[0] and key in diff[0]
    other = dict(golden, triton_version="0.0.0")
    assert ct.compare_golden(planted, other)[0].startswith("requalification needed")
    assert "not in the golden file" in ct.compare_golden(planted, dict(golden, fingerprints={}))[0]
    assert ct.compare_golden(planted, None)[0].startswith("no golden")


def test_report_format(planted):
    doc = ct.report(planted)
    assert "provenance" in doc and doc["kernels"]
    for k in doc["kernels"]:
        assert {"target", "compiled", "mma_form", "fp_fusion", "fingerprint"} <= set(k)


PTX = """
.file 1 "/home/x/kernel.py"
\t.loc 1 3 0 // kernel.py:3:0
$L__tmp0:
\twgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, p, 1, 1, 0, 1; // c
\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2};
\tfma.rn.f32 %f3, %f1, %f2, %f3;
\tred.global.add.f32 [%rd1], %f1;
\t.section .debug_info { .b32 1 }
"""
AMD = """
\t.file 1 "/home/x" "kernel.py"
\tv_mfma_f32_32x32x8_bf16 a[0:15], v[0:1], v[2:3], 0 ; comment v_mfma_f32_16x16x16_bf16
\tv_fmac_f32_e32 v1, v2, v3
\tglobal_atomic_add_f32 v0, v1, s[0:1]
\t.section .debug_str
\t.asciz "/home/x"
\t.section .rodata
"""


def test_asm_analysis_on_text():
    assert ct.mma_forms(PTX, "sm_90") == ["mma.sync.m16n8k16.f32.bf16.bf16", "wgmma.f32.bf16.bf16"]
    assert ct.mma_forms(AMD, "gfx942") == ["v_mfma_f32_32x32x8_bf16"]  # not the one in the comment
    assert ct.fma_count(PTX, "sm_90") == 1 and ct.fma_count(AMD, "gfx942") == 1
    assert ct.float_atomics(PTX, "sm_90") == ["red.global.add.f32"]
    assert ct.float_atomics(AMD, "gfx942") == ["global_atomic_add_f32"]
    for asm, t in ((PTX, "sm_90"), (AMD, "gfx942")):
        norm = ct.normalize_asm(asm, t)
        assert "/home/x" not in norm and ".loc" not in norm and "debug" not in norm
        moved = asm.replace("/home/x", "/elsewhere").replace(".loc 1 3 0", ".loc 1 9 0")
        assert ct.fingerprint_asm(moved, t) == ct.fingerprint_asm(asm, t)
        assert ct.fingerprint_asm(asm.replace("v1", "v9").replace("%f3", "%f4"), t) != ct.fingerprint_asm(asm, t)


def test_expected_mma_vocabulary():
    f = {"mma_form": {"sm_90": "wgmma.f32.bf16.bf16", "gfx942": ["v_mfma_f32_32x32x8_bf16"]}}
    assert ct.expected_mma_forms(f, "k", "sm_90", True) == ["wgmma.f32.bf16.bf16"]
    assert ct.expected_mma_forms(f, "k", "gfx942", True) == ["v_mfma_f32_32x32x8_bf16"]
    assert ct.expected_mma_forms(f, "k", "sm_90", False) == []  # a non-MMA kernel of the same contract
    assert ct.expected_mma_forms({}, "k", "sm_90", True) is None
    per_kernel = {"mma_form": {"attn.fwd": {"sm_90": "wgmma.f32.bf16.bf16"}}}
    assert ct.expected_mma_forms(per_kernel, "attn.fwd", "sm_90", False) == ["wgmma.f32.bf16.bf16"]
    assert ct.expected_mma_forms({"mma_form": "none"}, "k", "gfx942", True) == []


LAUNCHER = '''
import triton
from rlk.kernels.common import launch_options


@triton.jit
def k1(x):
    pass


def _opts(s):
    out = dict(launch_options())
    out["num_warps"] = s
    return out


def via_helper(x):
    k1[(1,)](x, **_opts(4))


def via_names(x):
    opts = launch_options()
    gm = dict(num_warps=4, **opts)
    k1[(1,)](x, **gm)


def explicit(x):
    k1[(1,)](x, enable_fp_fusion=False)


def unpinned(x):
    common = dict(num_warps=4)
    k1[(2,)](x, **common)


def through_launcher(x):
    launch(k1, (1,), x, num_warps=4, **launch_options())


def through_launcher_unpinned(x):
    launch(k1, (1,), x, num_warps=4)
'''


def test_launch_scan_follows_helpers_and_names(tmp_path):
    (tmp_path / "launch.py").write_text(LAUNCHER)
    (tmp_path / "launch_test.py").write_text("k1[(1,)](0)\n")  # tests are not scanned
    probs = ct.scan_launch_sites(tmp_path)
    assert len(probs) == 2, probs
    assert "launch.py:33: launch of k1" in probs[0] and "launch.py:41: launch of k1" in probs[1], probs


def test_host_code_calls_no_triton_constexpr_function(tmp_path):
    """Launchers compute grids and block sizes with rlk.kernels.common.cdiv / next_pow2: Triton's
    cdiv / next_power_of_2 cost ~4 us per host call (0a29f0b, 2d83486). The guard finds a planted
    host call and leaves kernel code alone."""
    from pathlib import Path

    import rlk.kernels
    from rlk.gate.launch_scan import host_constexpr_calls

    planted = tmp_path / "launch.py"
    planted.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(X, N: tl.constexpr):\n"
                       "    n = tl.cdiv(N, 16)\n\n\ndef grid(n):\n    return (triton.cdiv(n, 128),)\n")
    assert host_constexpr_calls(planted) == [(11, "triton.cdiv")]
    root = Path(rlk.kernels.__file__).resolve().parent
    found = {}
    for p in sorted(root.rglob("*.py")):
        if p.name.endswith(("_test.py", "_bench.py", "_variants.py", "_sweep.py", "_tune.py")):
            continue
        calls = host_constexpr_calls(p)
        if calls:
            found[str(p.relative_to(root))] = calls
    assert not found, f"host-side Triton constexpr calls (use rlk.kernels.common.cdiv / next_pow2): {found}"


def test_l0_checks_registered_for_every_profile():
    from rlk.gate import l0_checks  # noqa: F401 - registers the checks
    from rlk.gate.registry import PROFILES, checks_for

    for prof in PROFILES:
        names = {c.name for c in checks_for(prof) if c.level == "L0"}
        assert {"contracts.registered", "crosstarget.compile", "crosstarget.golden"} <= names, (prof, names)


def test_worker_count_changes_nothing_but_time(planted, tmp_path):
    """compile_all shards the (kernel, config, target) list over worker processes: one worker gives
    the same records, in the same order, and the same source-scan findings as several."""
    d = tmp_path / "one"
    d.mkdir()
    (d / "ct_plant_kernels.py").write_text(PLANT)
    one = ct.compile_all(modules=["ct_plant_kernels"], extra_paths=[str(d)], timeout=600, jobs=1)
    # ``planted`` ran with the default worker count; on a one-CPU machine that is 1 too: use 3.
    many = planted if ct.compile_jobs() > 1 else ct.compile_all(
        modules=["ct_plant_kernels"], extra_paths=[str(d)], timeout=600, jobs=3)
    key = [(r["kernel"], r["target"], r["config_id"]) for r in one["records"]]
    assert key == [(r["kernel"], r["target"], r["config_id"]) for r in many["records"]]
    assert [r["fingerprint"] for r in one["records"]] == [r["fingerprint"] for r in many["records"]]
    assert [r["problems"] for r in one["records"]] == [r["problems"] for r in many["records"]]
    def strip_dir(ps):  # the two runs planted the module in different folders
        return [q.split("/", 1)[1] for q in ps]

    assert one["launch_problems"] and strip_dir(one["launch_problems"]) == strip_dir(many["launch_problems"])


def test_compile_jobs_from_env(monkeypatch):
    monkeypatch.setenv("RLK_CROSSTARGET_JOBS", "3")
    assert ct.compile_jobs() == 3
    assert ct.compile_jobs(5) == 5
    monkeypatch.setenv("RLK_CROSSTARGET_JOBS", "x")
    with pytest.raises(ValueError, match="RLK_CROSSTARGET_JOBS"):
        ct.compile_jobs()
    monkeypatch.delenv("RLK_CROSSTARGET_JOBS")
    assert 1 <= ct.compile_jobs() <= 8
    with pytest.raises(ValueError, match=">= 1"):
        ct.compile_jobs(0)


def test_a_dying_worker_stops_the_others_and_fails(tmp_path):
    """Worker 0 dies while importing; worker 1 would sleep for ten minutes: compile_all raises
    with worker 0's exit status at once and kills worker 1 (no orphans, no wait for the deadline)."""
    import time

    (tmp_path / "ct_die.py").write_text(
        "import os, sys, time\n"
        "if sys.argv[-2].endswith('req0.json'):\n"
        "    os._exit(3)\n"
        "time.sleep(600)\n")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker 0/2 \(rc=3\)"):
        ct.compile_all(modules=["ct_die"], extra_paths=[str(tmp_path)], timeout=600, jobs=2)
    assert time.monotonic() - t0 < 120


def test_workers_past_the_deadline_are_killed(tmp_path):
    import time

    (tmp_path / "ct_sleep.py").write_text("import time\ntime.sleep(600)\n")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="still running after 5 s"):
        ct.compile_all(modules=["ct_sleep"], extra_paths=[str(tmp_path)], timeout=5, jobs=2)
    assert time.monotonic() - t0 < 60


def test_every_registered_kernel_compiles_and_matches_the_golden_file():
    """L0 on the real registry, as the release gate runs it (CI runs the tests, not the gate): every
    registered kernel configuration compiles for sm_90 and gfx942 within its contract's MMA form,
    fusion and atomics rules, and its fingerprint equals the checked-in golden file. A change that
    stops a kernel compiling on either target or alters its compiled code without a golden update
    fails here."""
    res = ct.compile_all()
    assert ct.problems(res) == []
    assert ct.compare_golden(res, ct.load_golden()) == []


def test_update_golden_refuses_while_a_config_fails(planted, monkeypatch, tmp_path):
    """--update-golden rewrites the file only when every configuration compiles cleanly: with a
    failing one it writes nothing (a golden file that silently lost that configuration would let
    L0 pass) and exits 1; without problems it writes the fingerprints."""
    golden = tmp_path / "golden.json"
    monkeypatch.setattr(ct, "GOLDEN_PATH", golden)
    bad = [r for r in planted["records"] if r["problems"]]
    assert bad, "the planted kernels include failing ones"
    monkeypatch.setattr(ct, "compile_all", lambda **kw: planted)
    assert ct.main(["--update-golden"]) == 1 and not golden.exists()
    good = dict(planted, records=[r for r in planted["records"] if not r["problems"]], launch_problems=[])
    monkeypatch.setattr(ct, "compile_all", lambda **kw: good)
    assert ct.main(["--update-golden"]) == 0 and golden.exists()
    assert ct.compare_golden(good, __import__("json").loads(golden.read_text())) == []
