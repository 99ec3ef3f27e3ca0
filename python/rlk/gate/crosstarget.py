"""Cross-target static checks (ladder L0): every strict kernel compiled for sm_90 and gfx942 on CPU.

Triton compiles for a GPU it does not have (``triton.compile(ASTSource(...), target=GPUTarget(...))``),
so without any GPU we compile every registered kernel (``rlk.kernels.registry``) with every
configuration of its checked-in tables for ``sm_90`` (``GPUTarget("cuda", 90, 32)``, PTX) and
``gfx942`` (``GPUTarget("hip", "gfx942", 64)``, AMDGCN) and verify, from the assembly:

* it compiles for every target its contract claims (``Contract.targets``);
* the MMA instruction form is the one the contract names (``bit_fields["mma_form"]``);
* floating-point fusion: the launch options (``rlk.kernels.common.launch_options()`` merged with
  the config's own options) give ``enable_fp_fusion`` equal to the contract's ``fp_fusion``; the
  same kernel is also compiled with fusion flipped: when the code differs, fusion is
  bit-relevant for it (recorded as ``fusion_relevant``). With fusion off, the kernel must hold no
  more FMAs than the fusion-off compile (explicit ``tl.fma`` only);
* no floating-point atomics (``atom.*.add.f32``/``red.*.f32`` in PTX, ``*_atomic_*f32``/``*_atomic_*f64``
  /``*_atomic_pk_add_*bf16`` in AMDGCN);
* every launch site of a strict kernel (``kernel[grid](...)`` in the op folder) pins fusion,
  by ``**launch_options()`` or an explicit ``enable_fp_fusion=`` (static scan of the source);
* a golden fingerprint per (target, Triton version, contract ID, kernel, config): sha256 of the
  normalized assembly (comments, ``.loc``/``.file`` lines and debug sections removed, paths
  masked), kept in ``crosstarget_golden.json``. A different hash is reported as
  "requalify: toolchain or kernel changed"; a different Triton version than the golden's as
  "requalification needed". Refresh with ``python -m rlk.gate.crosstarget --update-golden``
  after requalifying.

MMA form vocabulary (what a contract's ``bit_fields["mma_form"]`` holds)
-----------------------------------------------------------------------
``{"sm_90": FORM_OR_LIST, "gfx942": FORM_OR_LIST}``, optionally nested per kernel name
(``{"attention.fwd": {"sm_90": ..., "gfx942": ...}, ...}``; a kernel-name entry wins over the
contract-wide one). A list is the set of forms the contract allows: every MMA instruction in the
compiled code must be one of them, and a kernel registered with ``expects_mma=True`` must use at
least one. Allowing two forms (say ``wgmma`` for prefill tiles and ``mma.sync`` for BLOCK_M=16
decode tiles) is a bit-relevant claim: the GPU invariance tests must show those rows agree. Forms:

* sm_90 ``wgmma.<D>.<A>.<B>``: ``wgmma.mma_async`` of any N shape, e.g. ``"wgmma.f32.bf16.bf16"``
  (a bf16 ``tl.dot`` with fp32 accumulator; K is 16 for bf16). An fp32 ``tl.dot`` on GPU would
  show as ``wgmma.f32.tf32.tf32``: a different form, caught.
* sm_90 ``mma.sync.<shape>.<D>.<A>.<B>``: e.g. ``"mma.sync.m16n8k16.f32.bf16.bf16"`` (the K
  shape is kept: it is the per-instruction accumulation width).
* gfx942: the full MFMA mnemonic, e.g. ``"v_mfma_f32_32x32x8_bf16"`` or ``"v_mfma_f32_16x16x16_bf16"``
  (the MxNxK shape is bit-relevant: it sets how many products one instruction sums).
* ``"none"`` (or ``[]``): no MMA instruction at all.

A target the contract does not claim (``Contract.targets``) is compiled and recorded, but a
failure or a missing form there does not fail the check.
A kernel registered with ``expects_mma=False`` must compile to no MMA unless its contract names
a form for it by kernel name. Run ``python -m rlk.gate.crosstarget --out FILE.json`` to see the
forms each kernel compiles to (``mma_form``) and copy them into the contract.

Compilation always runs in clean worker subprocesses (:func:`compile_jobs` of them, each
compiling its share of the (kernel, config, target) list) with ``TRITON_INTERPRET`` and
``TRITON_DEFAULT_FP_FUSION`` removed from their environment (under the interpreter ``@triton.jit``
returns an ``InterpretedFunction``, which cannot be compiled), importing the kernel modules
fresh there. The launch-site scan is in :mod:`rlk.gate.launch_scan`. Fingerprints are of a compile without argument specialization hints (no
divisibility attrs), so they name the code generation, not the exact binary a live launch with
particular pointer alignments builds.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from rlk.gate.launch_scan import scan_launch_sites  # noqa: F401 - also the public name here
from rlk.provenance import GOLDEN_PATH, capability_record, fingerprints_by_kernel, load_golden

TARGETS = {"sm_90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64)}
ASM_KEY = {"sm_90": "ptx", "gfx942": "amdgcn"}
# A config key holding signature overrides for that config only ({arg: type}), e.g. tensor
# descriptor types ("tensordesc<bf16[64, 128]>") of a TMA variant whose other configs pass None.
SIGNATURE_KEY = "SIGNATURE"
# Config keys that are compile options, not constexprs (others must be constexprs of the kernel).
OPTION_KEYS = frozenset(
    {"num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "maxnreg", "matrix_instr_nonkdim",
     "waves_per_eu", "kpack", "launch_pdl"}
)
_TL_DTYPES = frozenset({"fp8e4nv", "fp8e5", "fp16", "bf16", "fp32", "fp64", "int1", "int8", "int16", "int32",
                        "int64", "uint8", "uint16", "uint32", "uint64"})
NORMALIZATION = "v1"  # bump when normalize_asm changes (every golden hash changes with it)
REQUALIFY = "requalify: toolchain or kernel changed"

# ----------------------------------------------------------------------------- assembly analysis

_PTX_MMA = re.compile(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)")
_AMD_MMA = re.compile(r"\b(v_mfma_\w+|v_smfmac_\w+)")
_PTX_FATOM = re.compile(r"\b((?:atom|red)\.[\w.]*?\.(?:f16|f16x2|bf16|bf16x2|f32|f64)\b[\w.]*)")
_AMD_FATOM = re.compile(r"\b(\w*_atomic_\w*(?:f32|f64|f16|bf16)\w*)")
_TTIR_FATOM = re.compile(r"tt\.atomic_rmw\s+fadd\b")
_PTX_FMA = re.compile(r"\bfma\.rn(?:\.ftz)?\.f32\b")
_AMD_FMA = re.compile(r"\b(v_fmac?_f32\w*|v_pk_fma_f32\w*|v_fma_mix\w*|v_fmamk_f32\w*|v_fmaak_f32\w*)")


def _code_lines(asm: str, target: str) -> list[str]:
    """Instruction text without comments (``;`` is a statement end in PTX, a comment in AMDGCN)."""
    cut = "//" if target == "sm_90" else ";"
    return [ln.split(cut, 1)[0] for ln in asm.splitlines()]


def mma_instructions(asm: str, target: str) -> list[str]:
    """Distinct raw MMA/MFMA mnemonics in ``asm``, sorted."""
    pat = _PTX_MMA if target == "sm_90" else _AMD_MMA
    return sorted({m for ln in _code_lines(asm, target) for m in pat.findall(ln)})


def canonical_mma_form(instr: str, target: str) -> str:
    """One raw mnemonic in the contract vocabulary (module docstring)."""
    if target != "sm_90":
        return instr
    parts = instr.split(".")
    dtypes = [p for p in parts if re.fullmatch(r"(f|bf|s|u|e4m3|e5m2|tf)\d*|e4m3|e5m2|tf32|b1", p)]
    if parts[0] == "wgmma":
        return "wgmma." + ".".join(dtypes[:3])
    shape = next((p for p in parts if re.fullmatch(r"m\d+n\d+k\d+", p)), "?")
    return f"mma.sync.{shape}." + ".".join(dtypes[:3])


def mma_forms(asm: str, target: str) -> list[str]:
    return sorted({canonical_mma_form(i, target) for i in mma_instructions(asm, target)})


def float_atomics(asm: str, target: str) -> list[str]:
    """Floating-point atomic / reduction instructions (never allowed in a strict kernel)."""
    pat = _PTX_FATOM if target == "sm_90" else _AMD_FATOM
    return sorted({m for ln in _code_lines(asm, target) for m in pat.findall(ln)})


def fma_count(asm: str, target: str) -> int:
    """Number of fp32 fused multiply-add instructions."""
    pat = _PTX_FMA if target == "sm_90" else _AMD_FMA
    return sum(len(pat.findall(ln)) for ln in _code_lines(asm, target))


def normalize_asm(asm: str, target: str) -> str:
    """Assembly without comments, line info, debug sections and file paths (fingerprint input)."""
    out, in_debug = [], False
    for ln in _code_lines(asm, target):
        s = ln.strip()
        if s.startswith(".section"):
            in_debug = bool(re.match(r"\.section\s+\"?\.debug", s))
            if target == "sm_90" and in_debug:
                break  # PTX puts its DWARF sections after the code, up to the end
        if in_debug or not s:
            continue
        if re.match(r"\.(loc|file|cfi_\w+)\b", s) or re.match(r"(\$L__tmp|\.Ltmp|\.Lfunc_begin|\.Ldebug)\w*:", s):
            continue
        out.append(re.sub(r"\"/[^\"]*\"", '"<path>"', s))
    return "\n".join(out) + "\n"


def fingerprint_asm(asm: str, target: str) -> str:
    return hashlib.sha256(normalize_asm(asm, target).encode()).hexdigest()


def fingerprint_compiled(compiled, target: str = "sm_90") -> str:
    """Fingerprint of a live ``CompiledKernel`` (``kernel[grid](...)``'s return value)."""
    return fingerprint_asm(compiled.asm[ASM_KEY[target]], target)


def expected_mma_forms(bit_fields: Mapping[str, Any], kernel: str, target: str, expects_mma: bool):
    """Forms the contract names for ``kernel`` on ``target``; None when it names none."""
    spec = bit_fields.get("mma_form")
    if isinstance(spec, Mapping) and kernel in spec:
        spec = spec[kernel]
    elif not expects_mma:
        return []
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        if target not in spec:
            return None
        spec = spec[target]
    if isinstance(spec, str):
        spec = [] if spec == "none" else [spec]
    return sorted(spec)


def config_id(config: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={_jsonable(config[k])}" for k in sorted(config))


def _jsonable(v):
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)


# ----------------------------------------------------------------------------- compile worker


def _compile(entry, constexprs, options, target, signature=None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import triton.language as tl

    fn = entry.fn
    sig = {**entry.signature, **(signature or {})}
    constexprs = dict(constexprs)
    for k, v in constexprs.items():  # tables read from JSON name dtypes as strings ("bf16")
        if isinstance(v, str) and v in _TL_DTYPES:
            constexprs[k] = tl.dtype(v)
    # A parameter the configuration leaves out compiles with its default, as a launch would (not
    # as None, which ASTSource passes for a parameter missing from the signature).
    for name, prm in inspect.signature(fn.fn).parameters.items():
        if name not in sig and name not in constexprs and prm.default is not inspect.Parameter.empty:
            constexprs[name] = prm.default
    for k in constexprs:
        sig[k] = "constexpr"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget(*TARGETS[target]), options=dict(options))


def _check_one(entry, contract, config, target, launch_opts) -> dict:
    cfg = dict(config)
    arg_names = list(getattr(entry.fn, "arg_names", []))
    signature = cfg.get(SIGNATURE_KEY)
    options = {**launch_opts, **{k: v for k, v in cfg.items() if k in OPTION_KEYS}}
    constexprs = {k: v for k, v in cfg.items() if k not in OPTION_KEYS and k != SIGNATURE_KEY}
    if "INTERPRET" in arg_names and "INTERPRET" not in constexprs:
        constexprs["INTERPRET"] = False  # its GPU value
    bits = dict(contract.bit_fields) if contract is not None else {}
    rec = {
        "kernel": entry.name, "contract_id": entry.contract_id, "target": target,
        "config_id": config_id(cfg), "config": {k: _jsonable(v) for k, v in sorted(cfg.items())},
        "claimed": contract is None or target in contract.targets,
        "compiled": False, "error": None, "mma_form": None, "mma_instructions": [],
        "expected_mma_form": None, "fp_fusion": None, "contract_fp_fusion": bits.get("fp_fusion"),
        "fusion_relevant": None, "fma_count": None, "float_atomics": [], "fingerprint": None,
        "problems": [],
    }
    probs = rec["problems"]
    unknown = [k for k in constexprs if arg_names and k not in arg_names]
    if unknown:  # reported; left out of the compile so that the other checks still run
        probs.append(f"config keys {unknown} are neither kernel arguments nor compile options")
        constexprs = {k: v for k, v in constexprs.items() if k not in unknown}
    if contract is None:
        probs.append(f"contract {entry.contract_id!r} is not registered")
    try:
        ck = _compile(entry, constexprs, options, target, signature)
    except Exception as e:  # noqa: BLE001 - the error text is the result
        rec["error"] = f"{type(e).__name__}: {e}"[-2000:]
        if rec["claimed"]:
            probs.append(f"does not compile for {target}, which contract {entry.contract_id} claims")
        return rec
    asm = ck.asm[ASM_KEY[target]]
    rec["compiled"] = True
    rec["fingerprint"] = fingerprint_asm(asm, target)
    rec["mma_instructions"] = mma_instructions(asm, target)
    forms = mma_forms(asm, target)
    rec["mma_form"] = ",".join(forms) if forms else "none"
    ff = bool(ck.metadata.enable_fp_fusion)
    rec["fp_fusion"] = ff
    rec["fma_count"] = fma_count(asm, target)
    rec["float_atomics"] = float_atomics(asm, target)
    if _TTIR_FATOM.search(ck.asm.get("ttir", "")):
        rec["float_atomics"].append("tt.atomic_rmw fadd (TTIR)")
    if rec["float_atomics"]:
        probs.append(f"floating-point atomics in the {target} code: {rec['float_atomics']}")
    want = expected_mma_forms(bits, entry.name, target, entry.expects_mma)
    rec["expected_mma_form"] = None if want is None else (",".join(want) if want else "none")
    if want is None and rec["claimed"]:  # a target the contract does not claim need not be named
        probs.append(
            f"contract {entry.contract_id} names no mma_form for {entry.name} on {target} "
            f"(compiled: {rec['mma_form']!r}; see rlk.gate.crosstarget's docstring)"
        )
    elif (want is not None and set(forms) - set(want)) or (entry.expects_mma and not forms):
        probs.append(f"MMA form {rec['mma_form']!r} on {target}, contract allows {rec['expected_mma_form']!r}")
    # Fusion: compile again with it flipped; differing code means fusion is bit-relevant here.
    try:
        other = _compile(entry, constexprs, {**options, "enable_fp_fusion": not ff}, target, signature)
        other_asm = other.asm[ASM_KEY[target]]
        rec["fusion_relevant"] = fingerprint_asm(other_asm, target) != rec["fingerprint"]
        unfused = fma_count(asm if not ff else other_asm, target)
    except Exception as e:  # noqa: BLE001
        probs.append(f"compile with enable_fp_fusion={not ff} failed: {type(e).__name__}: {e}"[:500])
        unfused = None
    cff = bits.get("fp_fusion")
    if cff is not None and ff != cff:
        rel = " (the code differs with fusion: bit-relevant)" if rec["fusion_relevant"] else ""
        probs.append(f"compiled with enable_fp_fusion={ff}, contract pins fp_fusion={cff}{rel}")
    if cff is False and unfused is not None and rec["fma_count"] > unfused:
        probs.append(f"{rec['fma_count'] - unfused} contracted FMAs in the {target} code although fp_fusion=False")
    return rec


def _worker(req: dict) -> dict:
    import importlib
    import traceback

    import triton

    for p in req.get("extra_paths", []):
        sys.path.insert(0, p)
    import_errors = []
    for m in req["modules"]:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - reported, fails the check
            import_errors.append(f"{m}: " + "".join(traceback.format_exception_only(e)).strip()[-1500:])
    from rlk import contracts
    from rlk.kernels import registry
    from rlk.kernels.common import launch_options

    launch_opts = launch_options()
    entries = [e for e in registry.all_kernels() if not req.get("kernels") or e.name in req["kernels"]]
    shard, n_shards = req.get("shard", (0, 1))
    records, scan, folders = [], [], {}
    job = 0
    for e in entries:
        try:
            contract = contracts.get(e.contract_id)
        except Exception:  # noqa: BLE001
            contract = None
        for cfg in e.configs:
            for t in req["targets"]:
                if job % n_shards == shard:  # this worker's share of the (kernel, config, target) list
                    records.append({"job": job, **_check_one(e, contract, cfg, t, launch_opts)})
                job += 1
        fn = getattr(e.fn, "fn", e.fn)
        folder = os.path.dirname(os.path.abspath(sys.modules[fn.__module__].__file__))
        folders.setdefault(folder, set()).add(fn.__name__)
        if not e.configs and shard == 0:
            scan.append(f"{e.name}: registered with no configs (nothing to compile)")
    if shard == 0:  # the source scan once, not once per worker
        for folder, names in sorted(folders.items()):
            scan += scan_launch_sites(folder, names)
    return {
        "triton_version": triton.__version__, "normalization": NORMALIZATION, "jobs": job,
        "import_errors": import_errors, "launch_problems": scan, "records": records,
    }


def compile_jobs(jobs: int | None = None) -> int:
    """Worker processes for :func:`compile_all`: ``jobs``, else ``$RLK_CROSSTARGET_JOBS``, else the
    CPUs this process may use, at most 8 (each worker imports torch and Triton: ~0.5 GB)."""
    if jobs is None:
        env = os.environ.get("RLK_CROSSTARGET_JOBS")
        if env:
            try:
                jobs = int(env)
            except ValueError:
                raise ValueError(f"RLK_CROSSTARGET_JOBS must be an integer, got {env!r}") from None
        else:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            jobs = min(8, cpus)
    if jobs < 1:
        raise ValueError(f"cross-target compile needs >= 1 worker, got {jobs}")
    return jobs


def compile_all(modules: Iterable[str] | None = None, kernels: Iterable[str] | None = None,
                extra_paths: Iterable[str] = (), targets: Iterable[str] = tuple(TARGETS),
                timeout: float = 1800.0, jobs: int | None = None) -> dict:
    """Compiles every registered kernel (after importing ``modules``, default the contract
    modules) in clean subprocesses; returns ``{"triton_version", "import_errors",
    "launch_problems", "records"}`` (one record per kernel, config and target, in registry order).

    ``jobs`` workers (:func:`compile_jobs`) each compile every jobs-th (kernel, config, target) of
    the registry's list; each compile is independent (its own Triton compile in a clean process),
    so the records do not depend on the worker count, only the wall time does."""
    if modules is None:
        from rlk.contracts import CONTRACT_MODULES

        modules = CONTRACT_MODULES
    n = compile_jobs(jobs)
    base = {"modules": list(modules), "kernels": list(kernels or []), "extra_paths": list(extra_paths),
            "targets": list(targets)}
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    if "TRITON_CACHE_DIR" not in env and env.get("TEST_TMPDIR"):  # Bazel sandbox: HOME may be read-only
        env["TRITON_CACHE_DIR"] = os.path.join(env["TEST_TMPDIR"], "triton_cache")
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory() as d:
        procs = []
        results, failures = [], []
        try:
            for i in range(n):
                rq, rs, re_ = (os.path.join(d, f"{k}{i}.json") for k in ("req", "res", "err"))
                Path(rq).write_text(json.dumps({**base, "shard": [i, n]}))
                with open(re_, "w") as err:  # a file, not a pipe: no worker blocks on a full pipe
                    procs.append((subprocess.Popen([sys.executable, "-m", "rlk.gate.crosstarget", "--worker", rq, rs],
                                                   env=env, stdout=subprocess.DEVNULL, stderr=err), rs, re_))
            pending = dict(enumerate(procs))
            while pending and not failures:  # the first failure stops the rest (finally below)
                for i, (proc, rs, re_) in list(pending.items()):
                    if proc.poll() is None:
                        continue
                    del pending[i]
                    if proc.returncode != 0 or not os.path.exists(rs):
                        failures.append(f"worker {i}/{n} (rc={proc.returncode}):\n{Path(re_).read_text()[-3000:]}")
                    else:
                        results.append(json.loads(Path(rs).read_text()))
                if pending and not failures:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"cross-target compile: {len(pending)} of {n} workers still running "
                                           f"after {timeout:.0f} s (workers {sorted(pending)} killed)")
                    time.sleep(0.2)
        finally:
            for proc, _, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if failures:
            raise RuntimeError("cross-target compile worker failed: " + "\n".join(failures))
    records = sorted((r for res in results for r in res["records"]), key=lambda r: r["job"])
    total = results[0]["jobs"]
    if [r["job"] for r in records] != list(range(total)):  # every (kernel, config, target) exactly once
        raise RuntimeError(f"cross-target compile: workers returned jobs {[r['job'] for r in records]}, "
                           f"expected 0..{total - 1}")
    for r in records:
        del r["job"]
    import_errors = []
    for res in results:  # every worker imports the same modules: report each error once
        import_errors += [e for e in res["import_errors"] if e not in import_errors]
    return {"triton_version": results[0]["triton_version"], "normalization": results[0]["normalization"],
            "import_errors": import_errors, "launch_problems": [p for res in results for p in res["launch_problems"]],
            "records": records}


def problems(result: Mapping[str, Any]) -> list[str]:
    """Every failure in a :func:`compile_all` result (empty when all is well)."""
    out = [f"import failed: {e}" for e in result["import_errors"]] + list(result["launch_problems"])
    for r in result["records"]:
        out += [f"{r['kernel']} [{r['target']}] {r['config_id']}: {p}" for p in r["problems"]]
    return out


# ----------------------------------------------------------------------------- golden fingerprints


def golden_key(r: Mapping[str, Any]) -> str:
    return f"{r['target']}|{r['contract_id']}|{r['kernel']}|{r['config_id']}"


def golden_from(result: Mapping[str, Any]) -> dict:
    fps = {golden_key(r): r["fingerprint"] for r in result["records"] if r["compiled"]}
    return {"format": 1, "triton_version": result["triton_version"], "normalization": result["normalization"],
            "fingerprints": dict(sorted(fps.items()))}


def compare_golden(result: Mapping[str, Any], golden: Mapping[str, Any] | None) -> list[str]:
    """Named differences between the compiled fingerprints and the golden file."""
    if golden is None:
        return ["no golden fingerprints (python -m rlk.gate.crosstarget --update-golden)"]
    for field in ("triton_version", "normalization"):
        if golden.get(field) != result[field]:
            return [f"requalification needed: golden {field} {golden.get(field)!r}, running {result[field]!r} "
                    "(requalify, then python -m rlk.gate.crosstarget --update-golden)"]
    cur = golden_from(result)["fingerprints"]
    old = golden["fingerprints"]
    out = []
    for k in sorted(set(cur) | set(old)):
        if k not in old:
            out.append(f"{k}: not in the golden file (new kernel/config: qualify, then --update-golden)")
        elif k not in cur:
            out.append(f"{k}: in the golden file but not compiled now (removed, renamed or failing)")
        elif cur[k] != old[k]:
            out.append(f"{k}: {REQUALIFY} (golden {old[k][:12]}, now {cur[k][:12]})")
    return out


def kernel_fingerprints(kernels: Iterable[str] | None = None, compile: bool = False) -> dict:
    """Fingerprints for the provenance record of a run that used ``kernels`` (names; all if None).

    ``compile=False`` reads the checked-in golden file (cheap); ``compile=True`` compiles now in a
    subprocess (what the current toolchain generates). Returns ``{"triton_version",
    "normalization", "source", "kernels": {name: {"contract_id", "fingerprints": {key: sha}}}}``.
    """
    if compile:
        return fingerprints_by_kernel(golden_from(compile_all(kernels=kernels)), kernels, "compiled")
    return fingerprints_by_kernel(load_golden(), kernels, "golden")


def report(result: Mapping[str, Any]) -> dict:
    """The ``docs/results/crosstarget.json`` document."""
    try:
        prov = capability_record()
    except Exception:  # noqa: BLE001 - fall back to the toolchain versions
        import platform

        prov = {"python": platform.python_version(), "triton": result["triton_version"]}
        try:
            import torch

            prov["torch"] = torch.__version__
        except Exception:  # noqa: BLE001
            pass
    prov = dict(prov, crosstarget_normalization=result["normalization"], compiled_on="cpu (no GPU)")
    kernels = [
        {k: r[k] for k in ("kernel", "contract_id", "target", "config_id", "compiled", "mma_form",
                           "expected_mma_form", "fp_fusion", "fusion_relevant", "float_atomics",
                           "fingerprint", "error", "problems")}
        for r in result["records"]
    ]
    return {"provenance": prov, "kernels": kernels, "problems": problems(result),
            "golden": compare_golden(result, load_golden())}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rlk.gate.crosstarget", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the docs/results/crosstarget.json document here")
    ap.add_argument("--update-golden", action="store_true", help=f"rewrite {GOLDEN_PATH.name}")
    ap.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
    ap.add_argument("--worker", nargs=2, metavar=("REQ", "RES"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        Path(a.worker[1]).write_text(json.dumps(_worker(json.loads(Path(a.worker[0]).read_text()))))
        return 0
    res = compile_all(kernels=a.kernel)
    for r in res["records"]:
        print(f"{r['kernel']:28s} {r['target']:7s} {'ok ' if r['compiled'] else 'ERR'} "
              f"{r['mma_form'] or '-':34s} fusion={r['fp_fusion']} {r['config_id']}")
    probs = problems(res)
    for p in probs:
        print("PROBLEM:", p)
    if a.update_golden:
        if a.kernel:
            ap.error("--update-golden rewrites the whole file: do not combine with --kernel")
        if probs:
            # A golden file written now would drop (or fingerprint) the configurations that fail.
            print(f"NOT written: {GOLDEN_PATH.name} is only rewritten when every configuration compiles "
                  f"cleanly ({len(probs)} problems above)")
        else:
            GOLDEN_PATH.write_text(json.dumps(golden_from(res), indent=1, sort_keys=True) + "\n")
            print(f"wrote {GOLDEN_PATH} ({len(res['records'])} fingerprints)")
    if a.out:
        Path(a.out).write_text(json.dumps(report(res), indent=1) + "\n")
        print(f"wrote {a.out}")
    return 1 if probs else 0


if __name__ == "__main__":
    sys.exit(main())
