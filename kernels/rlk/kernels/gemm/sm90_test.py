"""sm_90 CUTLASS route: table checks, route choice, build and loader (CPU); bytes vs Triton (GPU).

The probe's table building and twin comparisons are tested in sm90_probe_test.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from rlk import determinism
from rlk.errors import UnsupportedConfigError
from rlk.kernels.gemm import sm90


def _write(tmp_path, doc) -> str:
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    sm90._table.cache_clear()
    return str(p)


def test_the_checked_in_table_names_only_known_configurations():
    doc = sm90.table()
    assert doc["entries"], "no (K, N) entries"
    for key, bks in [*doc["entries"].items(), ("default", doc["default"])]:
        assert bks[-1][0] is None, f"{key}: the last bucket must be open"
        assert {b[1] for b in bks} - {None} <= set(sm90.CONFIGS), key


@pytest.mark.parametrize("bad", [[[64, "no_such_config"]], [[128, None], [64, "pp64x96"]],
                                 [[None, None], [64, None]], [[64]]])
def test_a_malformed_table_is_refused(tmp_path, bad):
    path = _write(tmp_path, {"entries": {"4096x4096": bad}, "default": [[None, None]]})
    with determinism.scoped({sm90.TABLE_ENV: path}), pytest.raises(UnsupportedConfigError):
        sm90.pick(1, 4096, 4096)


def test_pick_walks_the_buckets_and_falls_back_to_the_default_rule(tmp_path):
    path = _write(tmp_path, {"entries": {"4096x4096": [[64, None], [256, "pp64x96"], [None, "co128x256"]]},
                             "default": [[128, None], [None, "co128x128"]]})
    with determinism.scoped({sm90.TABLE_ENV: path}):
        assert [sm90.pick(m, 4096, 4096) for m in (1, 64, 65, 256, 257, 10**6)] == \
            [None, None, "pp64x96", "pp64x96", "co128x256", "co128x256"]
        assert [sm90.pick(m, 512, 768) for m in (128, 129)] == [None, "co128x128"]


class _FakeTensor:
    def __init__(self, stride0=4096, ptr=0):
        self._s, self._p = (stride0, 1), ptr

    def stride(self, i):
        return self._s[i]

    def data_ptr(self):
        return self._p


def test_route_serves_only_split_1_aligned_operands_and_obeys_the_mode(tmp_path, monkeypatch):
    path = _write(tmp_path, {"entries": {}, "default": [[None, "pp64x96"]]})
    monkeypatch.setattr(sm90, "available", lambda name: True)
    x, w = _FakeTensor(), _FakeTensor()
    with determinism.scoped({sm90.TABLE_ENV: path}):
        assert sm90.route(x, w, 8, 4096, 4096, 1) == "pp64x96"
        assert sm90.route(x, w, 8, 4096, 4096, 2) is None  # split shapes stay on Triton
        assert sm90.route(_FakeTensor(ptr=8), w, 8, 4096, 4096, 1) is None  # 8-byte aligned only
        assert sm90.route(x, _FakeTensor(stride0=4100), 8, 4096, 4096, 1) is None  # row stride not 16 B
        assert sm90.route(x, w, 8, 4096, 4100, 1) is None  # y's rows (N = 4100) not 16 B apart
    with determinism.scoped({sm90.TABLE_ENV: path, sm90.MODE_ENV: "off"}):
        assert sm90.route(x, w, 8, 4096, 4096, 1) is None
    with determinism.scoped({sm90.TABLE_ENV: path, sm90.MODE_ENV: "sometimes"}), \
            pytest.raises(UnsupportedConfigError, match="expected one of"):
        sm90.route(x, w, 8, 4096, 4096, 1)


def test_require_mode_fails_closed_without_the_library(tmp_path, monkeypatch):
    path = _write(tmp_path, {"entries": {}, "default": [[None, "pp64x96"]]})
    monkeypatch.setattr(sm90, "available", lambda name: False)
    with determinism.scoped({sm90.TABLE_ENV: path}):
        assert sm90.route(_FakeTensor(), _FakeTensor(), 8, 4096, 4096, 1) is None  # auto: Triton, same bytes
    with determinism.scoped({sm90.TABLE_ENV: path, sm90.MODE_ENV: "require"}), \
            pytest.raises(UnsupportedConfigError, match="does not have it"):
        sm90.route(_FakeTensor(), _FakeTensor(), 8, 4096, 4096, 1)


def test_a_128_deep_tile_serves_only_k_whose_chunks_come_in_pairs(tmp_path, monkeypatch):
    """A 128-deep configuration walks K in pairs of 64-chunks: where ceil(K / 64) is odd its last
    tile would add a zero-filled half chunk to v1's K walk, so gemm_into refuses it and the route
    falls back to the Triton kernels (same bytes), or, under require, says why."""
    deep, flat = "sw64x72x128w", "sw64x72w"
    assert [k for k in (64, 128, 192, 256, 320, 384, 4096, 4097, 4160, 4200) if sm90.serves_k(deep, k)] == \
        [128, 256, 384, 4096, 4200]  # 2, 4, 6, 64 and 66 chunks (the last one partial); 4097 and 4160: 65
    assert all(sm90.serves_k(flat, k) for k in (64, 192, 4097))
    x = torch.zeros((4, 192), dtype=torch.bfloat16)
    with pytest.raises(UnsupportedConfigError, match="odd number of 64-chunks"):
        sm90.gemm_into(x, x, x, deep)
    path = _write(tmp_path, {"entries": {}, "default": [[None, deep]]})
    monkeypatch.setattr(sm90, "available", lambda name: True)
    with determinism.scoped({sm90.TABLE_ENV: path}):
        assert sm90.route(_FakeTensor(), _FakeTensor(), 8, 4096, 4096, 1) == deep
        assert sm90.route(_FakeTensor(192), _FakeTensor(192), 8, 192, 4096, 1) is None
    with determinism.scoped({sm90.TABLE_ENV: path, sm90.MODE_ENV: "require"}), \
            pytest.raises(UnsupportedConfigError, match="cannot walk K=192"):
        sm90.route(_FakeTensor(192), _FakeTensor(192), 8, 192, 4096, 1)


def test_the_loader_refuses_an_object_built_as_another_configuration():
    """Each object describes the fields it was compiled with (``<symbol>_config()``); the loader
    compares them with CONFIGS, so a library built from another checkout's configuration under
    the same name is refused, not served. An object built before tile K was a field names none (64)."""
    new = "tile_m=64 tile_n=72 cluster_m=2 cluster_n=1 coop=2 swap_ab=1 tile_k=128 chunk_k=64"
    assert sm90.config_mismatch("sw64x72x128m2w", new) is None
    old = "tile_m=64 tile_n=72 cluster_m=2 cluster_n=1 coop=2 swap_ab=1 chunk_k=64"
    assert sm90.config_mismatch("sw64x72m2w", old) is None
    assert "tile_k=64" in sm90.config_mismatch("sw64x72x128m2w", old)
    assert "coop=0" in sm90.config_mismatch("sw64x72m2w", old.replace("coop=2", "coop=0"))
    assert sm90.config_mismatch("sw64x72m2w", old.replace("chunk_k=64", "chunk_k=32")) is not None
    assert sm90.config_mismatch("sw64x72m2w", "") is not None


@pytest.mark.skipif(not sm90.library_path().is_file(), reason="needs the built library (build/sm90)")
def test_the_built_library_describes_every_configuration_as_configs_does():
    """Where the library is built (no GPU needed to load it): every configuration's object agrees
    with CONFIGS, which the loader checks on every load."""
    import ctypes

    lib = ctypes.CDLL(str(sm90.library_path()))
    for name in sm90.CONFIGS:
        f = getattr(lib, sm90.symbol(name) + "_config")
        f.restype = ctypes.c_char_p
        assert sm90.config_mismatch(name, f().decode()) is None, name


def test_build_refuses_unknown_configurations_and_a_checkout_of_another_version(tmp_path):
    inc = tmp_path / "include" / "cutlass"
    inc.mkdir(parents=True)
    (inc / "cutlass.h").write_text("")
    (inc / "version.h").write_text("#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 9\n#define CUTLASS_PATCH 2\n")
    with pytest.raises(UnsupportedConfigError, match="version 3.9.2, the pin is v"):
        sm90.build(tmp_path / "out", str(tmp_path), names=["pp64x96"])
    major, minor, patch = sm90.pin()["tag"].lstrip("v").split(".")
    (inc / "version.h").write_text(f"#define CUTLASS_MAJOR {major}\n#define CUTLASS_MINOR {minor}\n"
                                   f"#define CUTLASS_PATCH {patch}\n")
    with pytest.raises(UnsupportedConfigError, match="unknown configurations"):
        sm90.build(tmp_path / "out", str(tmp_path), names=["pp64x96", "pp7x7"])
    with pytest.raises(UnsupportedConfigError, match="not a CUTLASS checkout"):
        sm90.build(tmp_path / "out", str(tmp_path / "nowhere"))


def test_every_configuration_is_a_legal_tile_and_its_compile_names_it(tmp_path, monkeypatch, capsys):
    """Each configuration's tile is one CUTLASS's sm_90 builders take (ping-pong and the
    non-persistent kernel: 64 rows per consumer warp group, named "ws" or, swapped, with a "w";
    cooperative: 128 or 256; wgmma N a multiple of 8 up to 256; clusters of at most 8 CTAs, named
    by their m/n suffix), and the build passes exactly its fields to nvcc, the
    operand swap included (a swapped configuration compiled unswapped would be another kernel under
    its name). A second build reuses the objects its stamps match and recompiles one whose source changed."""
    for name, (tm, tn, cm, cn, coop, swap, direct, tk) in sm90.CONFIGS.items():
        assert (tm == 64) if coop != 1 else tm in (128, 256), name
        assert tn % 8 == 0 and 8 <= tn <= 256 and swap in (0, 1) and cm in (1, 2, 4) and cn in (1, 2, 4), name
        assert cm * cn <= 8 and name.startswith("sw") == bool(swap) and coop in (0, 1, 2), name
        parts = re.fullmatch(r"(pp|co|ws|sw)(\d+)x(\d+)(?:x(\d+))?(m\d)?(n\d)?(w)?(d)?", name)
        assert parts and parts.groups() == ("sw" if swap else ("pp", "co", "ws")[coop], str(tm), str(tn),
                                            str(tk) if tk != 64 else None,
                                            f"m{cm}" if cm > 1 else None, f"n{cn}" if cn > 1 else None,
                                            "w" if swap and coop == 2 else None, "d" if direct else None), name
        assert direct in (0, 1) and tk in (64, 128), name
    inc = tmp_path / "cutlass" / "include" / "cutlass"
    inc.mkdir(parents=True)
    (inc / "cutlass.h").write_text("")
    major, minor, patch = sm90.pin()["tag"].lstrip("v").split(".")
    (inc / "version.h").write_text(f"#define CUTLASS_MAJOR {major}\n#define CUTLASS_MINOR {minor}\n"
                                   f"#define CUTLASS_PATCH {patch}\n")
    cmds = []

    class Done:
        returncode, stdout, stderr = 0, "nvcc: Cuda compilation tools, release 12.8", ""

    def fake_run(cmd, **kw):
        cmds.append(cmd)
        if "-o" in cmd:
            open(cmd[cmd.index("-o") + 1], "wb").write(b"lib")
        return Done()

    monkeypatch.setattr(sm90.subprocess, "run", fake_run)
    names = ["pp64x96", "co128x192m2", "sw64x48", "sw128x144", "sw128x80n2", "sw64x72m2d", "ws64x96", "sw64x72m2w",
             "sw64x72x128m2w"]

    def compiled():
        got = {c[c.index("-o") + 1].rsplit("/", 1)[-1][:-2]: c for c in cmds if "-c" in c}
        cmds.clear()
        return got

    sm90.build(tmp_path / "out", str(tmp_path / "cutlass"), jobs=1, names=names)
    compiles = compiled()
    assert sorted(compiles) == sorted(names)
    # The plan is printed before the first compile: how many, and which.
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"sm90: 9 of 9 configurations to compile (1 at a time), 0 up to date: {' '.join(names)}", first
    for name, cmd in compiles.items():
        tm, tn, cm, cn, coop, swap, direct, tk = sm90.CONFIGS[name]
        want = {f"-DRLK_TILE_M={tm}", f"-DRLK_TILE_N={tn}", f"-DRLK_TILE_K={tk}", f"-DRLK_CLUSTER_M={cm}",
                f"-DRLK_CLUSTER_N={cn}", f"-DRLK_COOP={coop}", f"-DRLK_SWAP_AB={swap}", f"-DRLK_SYMBOL={sm90.symbol(name)}"}
        assert want <= set(cmd), (name, cmd)
        assert ("-DRLK_EPI_DIRECT=1" in cmd) == bool(direct), (name, cmd)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["configs"]["sw64x48"] == [64, 48, 1, 1, 0, 1, 0, 64]
    assert manifest["configs"]["sw128x80n2"] == [128, 80, 1, 2, 1, 1, 0, 64]
    assert manifest["configs"]["sw64x72m2d"] == [64, 72, 2, 1, 0, 1, 1, 64]
    assert manifest["configs"]["sw64x72m2w"] == [64, 72, 2, 1, 2, 1, 0, 64]
    assert manifest["configs"]["sw64x72x128m2w"] == [64, 72, 2, 1, 2, 1, 0, 128]
    sm90.build(tmp_path / "out", str(tmp_path / "cutlass"), jobs=1, names=names)
    assert compiled() == {}
    monkeypatch.chdir(tmp_path)  # the same folders named relatively: the same stamps
    sm90.build(Path("out"), "cutlass", jobs=1, names=names)
    assert compiled() == {}
    (tmp_path / "out" / "sw64x48.o").unlink()  # a missing object, and a changed source, recompile
    capsys.readouterr()
    sm90.build(tmp_path / "out", str(tmp_path / "cutlass"), jobs=1, names=names)
    assert sorted(compiled()) == ["sw64x48"]
    assert "sm90: 1 of 9 configurations to compile (1 at a time), 8 up to date: sw64x48" in capsys.readouterr().out
    monkeypatch.setattr(sm90, "_sha256", lambda path: "another source")
    sm90.build(tmp_path / "out", str(tmp_path / "cutlass"), jobs=1, names=names)
    assert sorted(compiled()) == sorted(names)


def test_the_provenance_record_reads_what_the_route_reads(tmp_path):
    import hashlib
    from pathlib import Path

    from rlk import provenance

    root = str(Path(sm90.__file__).parents[1])
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"not a library")

    def sha(p):
        return f"sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}" if p.is_file() else "absent"

    for env in ({}, {sm90.LIB_ENV: str(lib), sm90.MODE_ENV: "off"}, {sm90.TABLE_ENV: str(tmp_path / "none.json")}):
        with determinism.scoped(env):
            want = (f"mode={env.get(sm90.MODE_ENV, 'auto')} library={sha(sm90.library_path())} "
                    f"table={sm90.table_path().name}:{sha(sm90.table_path())}")
            assert provenance.gemm_sm90_record(root)["native:gemm_sm90"] == want, env


def test_a_library_that_does_not_load_is_a_clear_error(tmp_path, monkeypatch):
    bad = tmp_path / "librlk_gemm_sm90.so"
    bad.write_bytes(b"not an ELF file")
    monkeypatch.setattr(sm90, "_LIB", [])
    table = _write(tmp_path, {"entries": {}, "default": [[None, "pp64x96"]]})
    with determinism.scoped({sm90.LIB_ENV: str(bad), sm90.TABLE_ENV: table}):
        with pytest.raises(UnsupportedConfigError, match="does not load"):
            sm90.route(_FakeTensor(), _FakeTensor(), 8, 4096, 4096, 1)
        with determinism.scoped({sm90.MODE_ENV: "off"}):  # off: the library is never loaded
            assert sm90.route(_FakeTensor(), _FakeTensor(), 8, 4096, 4096, 1) is None


def test_gemm_into_refuses_what_the_kernels_cannot_take():
    x = torch.zeros((4, 64), dtype=torch.bfloat16)
    with pytest.raises(UnsupportedConfigError, match="unknown configuration"):
        sm90.gemm_into(x, x, x, "pp7x7")


# ----------------------------------------------------------------------------------- GPU
def _sm90_library():
    return sm90.usable_here()


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90_library(), reason="needs an sm_90 GPU and the built library")
@pytest.mark.parametrize("name", list(sm90.CONFIGS))
def test_every_configuration_gives_the_triton_kernels_bytes(name):
    from rlk.kernels.gemm.launch import gemm

    g = torch.Generator(device="cuda").manual_seed(1)
    for K, N in ((4096, 6144), (1024, 4096), (192, 200), (384, 200)):
        w = (torch.randn((N, K), generator=g, device="cuda") / K ** 0.5).to(torch.bfloat16)
        for M in (1, 13, 64, 77, 200, 256, 513):
            x = torch.randn((M, K), generator=g, device="cuda").to(torch.bfloat16)
            with determinism.scoped({sm90.MODE_ENV: "off"}):
                ref = gemm(x, w)
            y = torch.empty_like(ref)
            if not sm90.serves_k(name, K):  # 128 deep, 3 chunks: refused, never run
                with pytest.raises(UnsupportedConfigError, match="odd number"):
                    sm90.gemm_into(y, x, w, name)
                continue
            sm90.gemm_into(y, x, w, name)
            assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), (name, K, N, M)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90_library(), reason="needs an sm_90 GPU and the built library")
def test_a_configuration_replays_from_a_cuda_graph_with_the_same_bytes():
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn((96, 4096), generator=g, device="cuda").to(torch.bfloat16)
    w = torch.randn((4096, 4096), generator=g, device="cuda").to(torch.bfloat16)
    y0, y1 = torch.empty((96, 4096), dtype=torch.bfloat16, device="cuda"), torch.empty((96, 4096), dtype=torch.bfloat16,
                                                                                         device="cuda")
    sm90.gemm_into(y0, x, w, "pp64x96")  # eager first: sets the shared-memory limit
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sm90.gemm_into(y1, x, w, "pp64x96")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y0.view(torch.int16), y1.view(torch.int16))


class _CudaStandIn:
    """What ``launch.sm90_route`` reads of a tensor (device and shape), as a CUDA tensor has them."""

    def __init__(self, *shape):
        self.shape = shape
        self.device = torch.device("cuda", 0)


def test_sm90_route_names_what_gemm_serves(monkeypatch):
    """``launch.sm90_route`` (gemm's dispatch and gemm_bench's ``served_by``) asks the table only on
    an sm_90 CUDA device, for bf16 out under v1, with (M, K, N) and v1's split count."""
    from rlk.kernels.gemm import contract, launch

    asked = []
    monkeypatch.setattr(sm90, "route", lambda x, w, M, K, N, split: asked.append((M, K, N, split)) or "pp64x96")
    monkeypatch.setattr(launch, "arch_of", lambda device: "sm_90")
    x, w = _CudaStandIn(5, 4096), _CudaStandIn(6144, 4096)
    assert launch.sm90_route(x, w) == "pp64x96"
    assert asked == [(5, 4096, 6144, contract.split_rule(4096, 6144))]
    assert launch.sm90_route(x, w, contract="gemm.bf16.v2") is None
    assert launch.sm90_route(x, w, out_dtype=torch.float32) is None
    assert launch.sm90_route(torch.zeros(5, 4096, dtype=torch.bfloat16), torch.zeros(6144, 4096, dtype=torch.bfloat16)) is None
    monkeypatch.setattr(launch, "arch_of", lambda device: "sm_100")
    assert launch.sm90_route(x, w) is None
    assert len(asked) == 1


def test_pack_and_unpack_round_trip_the_library_and_refuse_a_mismatch(tmp_path):
    """What a device call carries when its 64 MiB are nearly full: the library xz-compressed with
    its manifest; unpacking gives the same bytes, and a library whose sha256 is not the manifest's
    is refused."""
    import hashlib

    out, carry, dev = tmp_path / "sm90", tmp_path / "carry", tmp_path / "device"
    out.mkdir()
    lib = bytes(range(256)) * 512
    (out / sm90.LIB_NAME).write_bytes(lib)
    (out / "manifest.json").write_text(json.dumps({"sha256": hashlib.sha256(lib).hexdigest(),
                                                   "configs": {"pp64x96": list(sm90.CONFIGS["pp64x96"])}}))
    packed = sm90.pack(out, carry)
    assert packed.stat().st_size < len(lib) // 10
    assert sm90.unpack(carry, dev).read_bytes() == lib
    assert json.loads((dev / "manifest.json").read_text()) == json.loads((out / "manifest.json").read_text())
    (out / sm90.LIB_NAME).write_bytes(lib[:-1])  # rebuilt without a new manifest
    sm90.pack(out, carry)
    with pytest.raises(UnsupportedConfigError, match="its manifest says"):
        sm90.unpack(carry, tmp_path / "device2")
    with pytest.raises(UnsupportedConfigError, match="no built library"):
        sm90.pack(tmp_path / "nowhere", carry)
    packed.write_bytes(packed.read_bytes()[:100])  # a carry cut short
    with pytest.raises(UnsupportedConfigError, match="not a whole xz file"):
        sm90.unpack(carry, tmp_path / "device3")
