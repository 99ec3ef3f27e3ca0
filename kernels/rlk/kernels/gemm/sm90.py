"""gemm.bf16.v1 on sm_90a through CUTLASS kernels: configurations, build and loader.

Triton 3.6 gives Hopper power-of-two tiles only, no TMA multicast and no working warp
specialization; at M 96-512 cuBLAS runs one-wave tiles (96-, 144-, 192-wide) with a TMA producer
warp and two consumer warp groups (kernel names: docs/results/h100_2026-12-06_session21). The
kernels here are CUTLASS's warp-specialized TMA + wgmma GEMMs (``sm90/gemm_sm90.cu``) with v1's
single-segment arithmetic: one fp32 accumulator per element over ascending 64-wide K chunks,
one RNE rounding at the store. They serve only shapes whose v1 split count is 1 and only on
sm_90; everything else (split shapes, gfx942, the CPU) stays on the Triton kernels. Bytes equal
the Triton kernels' (GPU test ``sm90_test.py`` per configuration, invariance sweep across M).

Build (a CPU machine with nvcc >= 12.3 is enough; nothing here needs a GPU)::

    python -m rlk.kernels.gemm.sm90 build [--cutlass DIR] [--out build/sm90] [--jobs N]
    python -m rlk.kernels.gemm.sm90 pack      # build/sm90 -> build/sm90_carry (xz, for a device call)
    python -m rlk.kernels.gemm.sm90 unpack    # on the device: build/sm90_carry -> build/sm90, sha256-checked

CUTLASS is not vendored: ``--cutlass`` (or ``RLK_CUTLASS_DIR``) names a checkout of the tag pinned
in ``third_party/cutlass/pin.json``; without one the build clones it (network). The library and a
manifest (configs, nvcc and CUTLASS versions, sha256) land in ``--out``; ``RLK_GEMM_SM90_LIB`` (or
``build/sm90/librlk_gemm_sm90.so`` under the repository root) is what :func:`library` loads.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlk.errors import UnsupportedConfigError
from rlk.kernels.common import cdiv
from rlk.kernels.gemm.sm90_configs import CONFIGS

ROOT = Path(__file__).resolve().parents[4]
SOURCE = Path(__file__).with_name("sm90") / "gemm_sm90.cu"
PIN = ROOT / "third_party" / "cutlass" / "pin.json"
DEFAULT_OUT = ROOT / "build" / "sm90"
LIB_NAME = "librlk_gemm_sm90.so"
LIB_ENV = "RLK_GEMM_SM90_LIB"
CUTLASS_ENV = "RLK_CUTLASS_DIR"
# Which configuration serves which (K, N) and M range: written by ``sm90_probe --table-out``.
TABLE = Path(__file__).with_name("configs") / "sm90_cutlass.json"
TABLE_ENV = "RLK_GEMM_SM90_TABLE"
# auto: serve what the table picks where the library is loaded (else the Triton kernels, same
# bytes); off: Triton only (A/B timing); require: a table pick without the library is an error
# (benchmarks that report this route must not silently time the other one).
MODE_ENV = "RLK_GEMM_SM90"
MODES = ("auto", "off", "require")


# The C entry point's error codes (gemm_sm90.cu).
ERRORS = {1: "M, N or K below 1", 2: "a pointer or row stride is not 16-byte aligned (TMA)",
          3: "CUTLASS cannot implement this problem", 4: "the kernel asked for a workspace",
          5: "cudaFuncSetAttribute (shared memory) failed", 6: "the kernel launch failed"}


def symbol(name: str) -> str:
    return f"rlk_sm90_gemm_{name}"


def library_path() -> Path:
    """The library :func:`library` loads: ``$RLK_GEMM_SM90_LIB``, else ``build/sm90`` of the checkout."""
    return Path(os.environ.get(LIB_ENV) or DEFAULT_OUT / LIB_NAME)


def library_manifest() -> dict:
    """The ``manifest.json`` beside the library :func:`library` loads (configurations, sha256), or
    ``{"missing": path}``."""
    m = library_path().with_name("manifest.json")
    return json.loads(m.read_text()) if m.is_file() else {"missing": str(m)}


def table_path() -> Path:
    """The route table: ``$RLK_GEMM_SM90_TABLE``, else the checked-in ``configs/sm90_cutlass.json``."""
    return Path(os.environ.get(TABLE_ENV) or TABLE)


def pin() -> dict:
    return json.loads(PIN.read_text())


def _cutlass_dir(given: str | None) -> Path:
    d = given or os.environ.get(CUTLASS_ENV)
    p = pin()
    if d:
        path = Path(d).resolve()
    else:
        path = ROOT / ".cache" / f"cutlass-{p['tag']}"
        if not (path / "include" / "cutlass" / "cutlass.h").is_file():
            print(f"sm90: cloning CUTLASS {p['tag']} into {path}", flush=True)
            subprocess.run(["git", "clone", "--depth", "1", "--branch", p["tag"], p["url"], str(path)], check=True)
    if not (path / "include" / "cutlass" / "cutlass.h").is_file():
        raise UnsupportedConfigError(f"sm90: {path} is not a CUTLASS checkout (no include/cutlass/cutlass.h)")
    version = path / "include" / "cutlass" / "version.h"
    text = version.read_text() if version.is_file() else ""
    want = p["tag"].lstrip("v").split(".")
    got = [_define(text, f"CUTLASS_{k}") for k in ("MAJOR", "MINOR", "PATCH")]
    if got != want:
        raise UnsupportedConfigError(f"sm90: CUTLASS at {path} is version {'.'.join(got)}, the pin is {p['tag']}")
    return path


def _define(text: str, name: str) -> str:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "#define" and parts[1] == name:
            return parts[2]
    return "?"


def nvcc_flags(cutlass: Path) -> list:
    return ["-std=c++17", "-O3", "-DNDEBUG", "-gencode", "arch=compute_90a,code=sm_90a",
            "--expt-relaxed-constexpr", "-diag-suppress", "20012", "-Xcompiler", "-fPIC",
            f"-I{cutlass / 'include'}", f"-I{cutlass / 'tools' / 'util' / 'include'}"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(out: Path, cutlass_dir: str | None = None, jobs: int | None = None, names=None) -> Path:
    """Compile every configuration (one object each, ``jobs`` at a time) and link the library. An
    object whose stamp (``<name>.stamp.json``: nvcc command, source sha256, nvcc version) matches is
    reused, so adding a configuration compiles that one only."""
    cutlass = _cutlass_dir(cutlass_dir)
    # Absolute paths in the nvcc command, so that a stamp does not depend on how the folder was named.
    out = Path(out).resolve()
    names = list(names or CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise UnsupportedConfigError(f"sm90: unknown configurations {unknown} (known: {sorted(CONFIGS)})")
    out.mkdir(parents=True, exist_ok=True)
    flags = nvcc_flags(cutlass)
    nvcc_version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    source_sha = _sha256(SOURCE)

    def plan(name: str):
        """The object, its nvcc command and the stamp key that marks it up to date."""
        tm, tn, cm, cn, coop, swap, direct, tk = CONFIGS[name]
        obj = out / f"{name}.o"
        cmd = ["nvcc", *flags, f"-DRLK_TILE_M={tm}", f"-DRLK_TILE_N={tn}", f"-DRLK_TILE_K={tk}", f"-DRLK_CLUSTER_M={cm}",
               f"-DRLK_CLUSTER_N={cn}", f"-DRLK_COOP={coop}", f"-DRLK_SWAP_AB={swap}", f"-DRLK_SYMBOL={symbol(name)}",
               *(["-DRLK_EPI_DIRECT=1"] if direct else []), "-c", str(SOURCE), "-o", str(obj)]
        key = json.dumps({"cmd": cmd, "source_sha256": source_sha, "nvcc": nvcc_version}, sort_keys=True)
        return obj, cmd, key

    plans = {n: plan(n) for n in names}

    def up_to_date(name: str) -> bool:
        # An object is reused only when its stamp names the same command, source and compiler.
        obj, _, key = plans[name]
        stamp = obj.with_suffix(".stamp.json")
        return obj.is_file() and stamp.is_file() and stamp.read_text() == key

    def compile_one(name: str) -> Path:
        obj, cmd, key = plans[name]
        stamp = obj.with_suffix(".stamp.json")
        stamp.unlink(missing_ok=True)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"sm90: nvcc failed for {name}:\n{r.stderr[-4000:]}")
        stamp.write_text(key)
        print(f"sm90: compiled {name} in {time.perf_counter() - t0:.0f} s", flush=True)
        return obj

    stale = [n for n in names if not up_to_date(n)]
    workers = jobs or os.cpu_count() or 1
    # Said before the first object, which takes about a minute: what will compile and what is reused.
    print(f"sm90: {len(stale)} of {len(names)} configurations to compile ({workers} at a time), "
          f"{len(names) - len(stale)} up to date" + (f": {' '.join(stale)}" if stale else ""), flush=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(compile_one, stale))
    objs = [plans[n][0] for n in names]
    lib = out / LIB_NAME
    subprocess.run(["nvcc", "-shared", "-cudart", "static", "-o", str(lib), *map(str, objs)], check=True)
    manifest = {"library": LIB_NAME, "sha256": _sha256(lib), "configs": {n: CONFIGS[n] for n in names},
                "cutlass": pin(), "nvcc": nvcc_version.strip().splitlines()[-1], "flags": flags[:-2],
                "source_sha256": source_sha}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"sm90: {lib} ({lib.stat().st_size} bytes, {len(names)} configurations)", flush=True)
    return lib


def pack(out: Path, dest: Path) -> Path:
    """xz-compress the built library into ``dest`` with its manifest (about a tenth of its size):
    what a device call carries when the 64 MiB it takes is nearly full."""
    import lzma  # noqa: PLC0415

    lib, manifest = out / LIB_NAME, out / "manifest.json"
    if not (lib.is_file() and manifest.is_file()):
        raise UnsupportedConfigError(f"sm90 pack: no built library in {out} (python -m rlk.kernels.gemm.sm90 build)")
    dest.mkdir(parents=True, exist_ok=True)
    packed = dest / (LIB_NAME + ".xz")
    packed.write_bytes(lzma.compress(lib.read_bytes(), preset=9))
    (dest / "manifest.json").write_bytes(manifest.read_bytes())
    print(f"sm90: {packed} ({packed.stat().st_size} bytes, from {lib.stat().st_size})", flush=True)
    return packed


def unpack(src: Path, out: Path) -> Path:
    """The library :func:`pack` wrote, decompressed into ``out``; its sha256 must equal the
    manifest's (a truncated or mismatched carry is an error, not a library that half loads)."""
    import lzma  # noqa: PLC0415

    manifest_bytes = (src / "manifest.json").read_bytes()
    manifest = json.loads(manifest_bytes)
    try:
        data = lzma.decompress((src / (LIB_NAME + ".xz")).read_bytes())
    except lzma.LZMAError as e:
        raise UnsupportedConfigError(f"sm90 unpack: {src / (LIB_NAME + '.xz')} is not a whole xz file ({e})") from None
    got = hashlib.sha256(data).hexdigest()
    if got != manifest["sha256"]:
        raise UnsupportedConfigError(f"sm90 unpack: {src} holds a library with sha256 {got[:16]}..., "
                                     f"its manifest says {manifest['sha256'][:16]}...")
    out.mkdir(parents=True, exist_ok=True)
    (out / LIB_NAME).write_bytes(data)
    (out / "manifest.json").write_bytes(manifest_bytes)
    print(f"sm90: {out / LIB_NAME} (sha256 {got[:16]}..., {len(manifest['configs'])} configurations)", flush=True)
    return out / LIB_NAME


_LIB: list = []  # [ctypes.CDLL | None] once loaded


def library():
    """The loaded library, or None where there is none (not built, or not carried)."""
    if not _LIB:
        path = library_path()
        lib = None
        if path.is_file():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:  # a library that is there but does not load is a broken install
                raise UnsupportedConfigError(f"sm90: {path} does not load ({e}); rebuild it, remove it, or "
                                             f"set {MODE_ENV}=off for the Triton kernels") from None
            for name in CONFIGS:
                if hasattr(lib, symbol(name)):
                    f = getattr(lib, symbol(name))
                    f.restype = ctypes.c_int
                    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_longlong] * 3 + [ctypes.c_void_p]
                    described = getattr(lib, symbol(name) + "_config", None)
                    if described is not None:
                        described.restype = ctypes.c_char_p
                        wrong = config_mismatch(name, described().decode())
                        if wrong:
                            raise UnsupportedConfigError(f"sm90: {path}: {name} was built as {wrong}; rebuild it "
                                                         f"(python -m rlk.kernels.gemm.sm90 build)")
        _LIB.append(lib)
    return _LIB[0]


# The fields a library object names in its ``<symbol>_config()`` string, by CONFIGS index; an
# object built before tile K was a field names no tile_k (it was 64).
_DESCRIBED = {"tile_m": 0, "tile_n": 1, "cluster_m": 2, "cluster_n": 3, "coop": 4, "swap_ab": 5, "tile_k": 7}


def config_mismatch(name: str, described: str) -> str | None:
    """None when the object's own description (``tile_m=64 tile_n=72 ... tile_k=128 chunk_k=64``)
    agrees with ``CONFIGS[name]``, else the fields it was built with: a library whose object under a
    name is another kernel than this checkout's configuration must not serve that name."""
    got = dict(kv.split("=", 1) for kv in described.split() if "=" in kv)
    got.setdefault("tile_k", "64")
    want = {k: str(CONFIGS[name][i]) for k, i in _DESCRIBED.items()}
    if got.get("chunk_k", "64") != "64" or any(got.get(k) != v for k, v in want.items()):
        return " ".join(f"{k}={got.get(k)}" for k in (*_DESCRIBED, "chunk_k"))
    return None


def usable_here() -> bool:
    """An sm_90 GPU and a library that loads: where the route's configurations can run (the GPU tests' condition)."""
    import torch  # noqa: PLC0415

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and library() is not None


def available(name: str) -> bool:
    lib = library()
    return lib is not None and hasattr(lib, symbol(name))


def serves_k(name: str, K: int) -> bool:
    """Whether ``name`` walks exactly the contract's K chunks at this K. A tile one chunk deep
    always does; a 128-deep tile only where K's 64-chunks come in pairs (ceil(K / 64) even): with an
    odd count its last tile's second half is zero-filled by TMA and four extra 0 * 0 k-steps run on
    the accumulator, a step v1's chain does not have (and an accumulator of -0 would come out +0)."""
    return CONFIGS[name][7] == 64 or cdiv(K, 64) % 2 == 0


def gemm_into(y, x, w, name: str) -> None:
    """``y = x @ w.T`` by configuration ``name`` on the current CUDA stream (bf16, row strides
    free, unit column strides, 16-byte aligned). Raises UnsupportedConfigError on what it cannot do."""
    import torch  # noqa: PLC0415

    if name not in CONFIGS:
        raise UnsupportedConfigError(f"sm90: unknown configuration {name!r}")
    if not serves_k(name, x.shape[-1]):
        raise UnsupportedConfigError(f"sm90 {name}: its tiles are 128 deep and K={x.shape[-1]} has an odd number of "
                                     f"64-chunks (the last tile would add a zero-filled half chunk to the K walk)")
    if not available(name):
        raise UnsupportedConfigError(f"sm90: configuration {name!r} is not in the loaded library "
                                     f"(build it: python -m rlk.kernels.gemm.sm90 build; or set {LIB_ENV})")
    for t, what in ((x, "x"), (w, "w"), (y, "y")):
        if t.dtype != torch.bfloat16 or t.device.type != "cuda" or t.dim() != 2 or t.stride(1) != 1:
            raise UnsupportedConfigError(f"sm90: {what} must be a 2-D bf16 CUDA tensor with unit column "
                                         f"stride, got {t.dtype} {t.device} strides {t.stride()}")
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K or tuple(y.shape) != (M, N):
        raise UnsupportedConfigError(f"sm90: shapes x {tuple(x.shape)}, w {tuple(w.shape)}, y {tuple(y.shape)}")
    stream = torch.cuda.current_stream(x.device).cuda_stream
    rc = getattr(library(), symbol(name))(x.data_ptr(), w.data_ptr(), y.data_ptr(), M, N, K,
                                          x.stride(0), w.stride(0), y.stride(0), stream)
    if rc != 0:
        raise UnsupportedConfigError(f"sm90 {name}: {ERRORS.get(rc, f'error {rc}')} "
                                     f"(M={M}, N={N}, K={K}, strides x {x.stride()}, w {w.stride()})")


def mode() -> str:
    m = os.environ.get(MODE_ENV) or "auto"
    if m not in MODES:
        raise UnsupportedConfigError(f"{MODE_ENV}={m!r}: expected one of {MODES}")
    return m


@functools.lru_cache(maxsize=8)
def _table(path: str) -> dict:
    doc = json.loads(Path(path).read_text())
    for key, bks in [*doc.get("entries", {}).items(), ("default", doc.get("default", []))]:
        _check_buckets(path, key, bks)
    return doc


def _check_buckets(path: str, key: str, bks: list) -> None:
    last = 0
    for i, b in enumerate(bks):
        if not (isinstance(b, list) and len(b) == 2 and (b[1] is None or b[1] in CONFIGS)):
            raise UnsupportedConfigError(f"{path}: {key} bucket {b!r}: expected [max_m, config name or null]")
        if b[0] is None:
            if i != len(bks) - 1:
                raise UnsupportedConfigError(f"{path}: {key}: an open bucket (null max_m) must be the last")
        elif not (isinstance(b[0], int) and b[0] > last):
            raise UnsupportedConfigError(f"{path}: {key}: max_m must ascend, got {b[0]} after {last}")
        else:
            last = b[0]


def table() -> dict:
    return _table(str(table_path()))


def buckets(K: int, N: int) -> list:
    """``[[max_m or None, config or None], ...]`` for (K, N): its entry, else the default rule."""
    if not table_path().is_file():
        return []
    return buckets_in(table(), K, N)


def buckets_in(doc: dict, K: int, N: int) -> list:
    """(K, N)'s buckets in the table ``doc``: its entry, else the default rule."""
    return doc.get("entries", {}).get(f"{K}x{N}", doc.get("default", []))


def pick_in(bks: list, M: int) -> str | None:
    """The configuration of the first bucket ``[max_m, name]`` that holds M (null max_m: every M),
    or None (the Triton kernels serve it)."""
    for max_m, name in bks:
        if max_m is None or M <= max_m:
            return name
    return None


def pick(M: int, K: int, N: int) -> str | None:
    """The configuration the table names for (M, K, N), or None (the Triton kernels serve it)."""
    return pick_in(buckets(K, N), M)


def _aligned(t) -> bool:
    return t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


def route(x, w, M: int, K: int, N: int, split: int) -> str | None:
    """The configuration that serves ``x @ w.T`` on this call, or None for the Triton kernels.

    Served: sm_90, split count 1, bf16 out, TMA-compatible operands and output (unit column
    stride, 16-byte aligned rows: N a multiple of 8) and a table pick. The two routes give the same bytes, so None is never a
    change of arithmetic; ``RLK_GEMM_SM90=require`` turns a pick the library lacks into an error."""
    m = mode()
    if m == "off" or split != 1:
        return None
    name = pick(M, K, N)
    # y is allocated contiguous: its rows are 16-byte aligned (TMA store) only when N % 8 == 0.
    if name is None or N % 8 or not (_aligned(x) and _aligned(w)):
        return None
    if not serves_k(name, K):
        if m == "require":
            raise UnsupportedConfigError(f"{MODE_ENV}=require: the table picks {name} for M={M}, K={K}, N={N}, "
                                         f"whose 128-deep tiles cannot walk K={K} (an odd number of 64-chunks)")
        return None
    if not available(name):
        if m == "require":
            raise UnsupportedConfigError(f"{MODE_ENV}=require: the table picks {name} for M={M}, K={K}, N={N} "
                                         f"but the library does not have it ({LIB_ENV}, or build it)")
        return None
    return name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Build rlk's sm_90a CUTLASS GEMM library.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile every configuration and link the library")
    b.add_argument("--cutlass", default=None, help=f"CUTLASS checkout (else ${CUTLASS_ENV}, else clone the pin "
                                                   "into .cache/)")
    # Under `bazel run` the default lands in the workspace, not in the runfiles tree.
    ws = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    b.add_argument("--out", default=str(Path(ws) / "build" / "sm90" if ws else DEFAULT_OUT))
    b.add_argument("--jobs", type=int, default=None)
    b.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    default_out = Path(ws) / "build" / "sm90" if ws else DEFAULT_OUT
    p = sub.add_parser("pack", help="xz-compress the built library and its manifest for a device call")
    p.add_argument("--out", default=str(default_out), help="the build folder")
    p.add_argument("--dest", default=str(default_out.parent / "sm90_carry"))
    u = sub.add_parser("unpack", help="decompress a packed library into the build folder, sha256-checked")
    u.add_argument("--src", default=str(default_out.parent / "sm90_carry"))
    u.add_argument("--out", default=str(default_out))
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(Path(args.out), Path(args.dest))
    elif args.cmd == "unpack":
        unpack(Path(args.src), Path(args.out))
    else:
        build(Path(args.out), args.cutlass, args.jobs, args.configs.split(",") if args.configs else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
