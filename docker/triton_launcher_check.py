"""CPU-only check, inside rlk-h200, that Triton's NVIDIA C module can be BUILT (no GPU needed).

    podman run --rm --network=none -v "$PWD/docker:/mnt:ro" localhost/rlk-h200:latest \\
      python /mnt/triton_launcher_check.py [--inductor]

Triton's NVIDIA driver compiles triton/backends/nvidia/driver.c (module `cuda_utils`: the driver
utils; in Triton 3.8 also the generic kernel launcher, in 3.6 a C launcher per kernel signature
built the same way) with the system C compiler against <Python.h> the first time it runs a kernel.
Here there is no NVIDIA driver, so:
  1. the C compiler Triton finds, and what it finds without /usr/bin on PATH (the old image);
  2. Triton's libcuda lookup as is (fails: no libcuda.so.1 without the NVIDIA container toolkit);
  3. the module built with CudaUtils' own arguments against an empty stub libcuda.so.1 (linked,
     not loadable: the driver symbols are undefined);
  4. against a stub defining those symbols (each returns CUDA_ERROR_NO_DEVICE): CudaUtils() loads.
--inductor: also torch.compile a small CPU function (inductor's C++ path, g++ + <Python.h>).
Prints one JSON object; exits 1 if the module could not be built or loaded.
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def stub(symbols: list[str]) -> str:
    d = tempfile.mkdtemp(prefix="libcuda-stub-")
    code = "int rlk_libcuda_stub;\n" + "".join(f"int {s}(void) {{ return 100; }}\n" for s in symbols)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", os.path.join(d, "libcuda.so.1"),
                    "-x", "c", "-"], input=code.encode(), check=True)
    return d


def needed(so: str) -> list[str]:
    dyn = subprocess.run(["readelf", "-d", so], capture_output=True, text=True).stdout
    return [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]


def find_c_compiler(build) -> str:
    """The C compiler Triton's build would use (raises RuntimeError as Triton does when none)."""
    if hasattr(build, "_find_compiler"):  # Triton 3.8
        build._find_compiler.cache_clear()
        return build._find_compiler("c")
    # Triton 3.6 looks inline in _build: $CC, else gcc, else clang on PATH
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable or set "
                           "triton.knobs.build.impl.")
    return cc


def build_only(build, src: str, library_dirs: list[str], include_dirs: list[str], libraries: list[str]) -> str:
    """Compile and link `cuda_utils` with Triton's own arguments, without loading it."""
    if hasattr(build, "compile_so_from_file"):  # Triton 3.8
        return build.compile_so_from_file(src, "cuda_utils", library_dirs=library_dirs,
                                          include_dirs=include_dirs, libraries=libraries)
    # Triton 3.6: compile_module_from_src builds with _build, then loads; call _build alone
    tmp = tempfile.mkdtemp(prefix="cuda-utils-")
    path = os.path.join(tmp, "cuda_utils.c")
    with open(src) as f, open(path, "w") as g:
        g.write(f.read())
    return build._build("cuda_utils", path, tmp, library_dirs, include_dirs, libraries, [])


def main() -> int:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")
    import triton
    import triton.backends.nvidia.driver as drv
    from triton.runtime import build

    res = {"triton": triton.__version__, "python": sys.version.split()[0]}
    src = os.path.join(drv.dirname, "driver.c")
    res["c_compiler"] = find_c_compiler(build)
    path = os.environ["PATH"]
    os.environ["PATH"] = os.path.dirname(sys.executable)
    try:
        res["c_compiler_without_usr_bin"] = find_c_compiler(build)
    except RuntimeError as e:
        res["c_compiler_without_usr_bin"] = f"RuntimeError: {e}"
    os.environ["PATH"] = path
    if hasattr(build, "_find_compiler"):
        build._find_compiler.cache_clear()

    try:
        drv.library_dirs()
        res["libcuda_lookup"] = "found"
    except AssertionError as e:
        res["libcuda_lookup"] = "AssertionError: " + str(e).splitlines()[0]

    ok = True
    # 3. empty stub: compile + link exactly as CudaUtils does, without loading
    os.environ["TRITON_LIBCUDA_PATH"] = stub([])
    drv.libcuda_dirs.cache_clear()
    drv.library_dirs.cache_clear()
    try:
        so = build_only(build, src, drv.library_dirs(), drv.include_dirs, drv.libraries)
        und = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True).stdout.split()
        cu = sorted(s for s in und if s.startswith("cu"))
        res["built"] = {"bytes": os.path.getsize(so), "needed": needed(so), "undefined_cu_symbols": cu,
                        "undefined_py_symbols": sum(1 for s in und if s.startswith("Py"))}
    except Exception as e:  # noqa: BLE001
        res["built"] = f"{type(e).__name__}: {e}"
        print(json.dumps(res, indent=1))
        return 1
    # 4. stub with the driver symbols: the real constructor (compile + load)
    d = stub(cu)
    os.environ["TRITON_LIBCUDA_PATH"] = d
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")
    ctypes.CDLL(os.path.join(d, "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    drv.libcuda_dirs.cache_clear()
    drv.library_dirs.cache_clear()
    try:
        u = drv.CudaUtils()
        res["CudaUtils()"] = "loaded: " + ", ".join(n for n in ("launch", "load_binary", "get_device_properties")
                                                    if hasattr(u, n))
        sos = [os.path.join(r, f) for r, _, fs in os.walk(os.environ["TRITON_CACHE_DIR"]) for f in fs
               if f.endswith(".so")]
        res["CudaUtils() module needed"] = needed(sos[0])
    except Exception as e:  # noqa: BLE001
        res["CudaUtils()"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        ok = False

    if "--inductor" in sys.argv:
        import torch
        from torch._inductor import config
        t = time.time()
        f = torch.compile(lambda x: (x * 2).sin() + x.cos(), backend="inductor")
        x = torch.randn(64)
        same = bool(torch.allclose(f(x), (x * 2).sin() + x.cos()))
        res["inductor_cpu"] = {"allclose_to_eager": same, "cpp_cxx": list(config.cpp.cxx),
                               "seconds": round(time.time() - t, 1)}
        ok = ok and same
    print(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
