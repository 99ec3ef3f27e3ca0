"""Health probes recorded with every benchmark pair, and the envelope a pair must sit in.

Declared envelope: a pair is rejected when either arm's copy bandwidth is more than
``BANDWIDTH_TOLERANCE`` away from the median over all arms of the run, or when an arm's SM clock
(where readable) is below ``CLOCK_FLOOR`` of the highest clock seen in the run. Rejected pairs
are listed in the report and never enter the ratio.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

BANDWIDTH_TOLERANCE = 0.10
CLOCK_FLOOR = 0.90


def copy_bandwidth_tbps(nbytes: int = 1 << 30, reps: int = 5) -> float | None:
    """Device-to-device copy bandwidth (bytes read + written per second), median of ``reps``."""
    import torch

    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    del src, dst
    return 2 * nbytes / times[len(times) // 2] / 1e12


def gpu_state() -> dict[str, Any]:
    """SM clock, temperature, power and memory, via NVML where available (read only)."""
    out: dict[str, Any] = {"time": time.time()}
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            out.update(mem_free_gib=round(free / 2**30, 2), mem_total_gib=round(total / 2**30, 2))
    except Exception as e:
        out["mem_error"] = str(e)
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        out["mem_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
        out["temperature_c"] = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        out["power_w"] = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
    except Exception as e:  # NVML absent (CPU, ROCm): recorded, not fatal
        out["nvml"] = f"unavailable: {type(e).__name__}"
    return out


def probe() -> dict[str, Any]:
    st = gpu_state()
    st["copy_tbps"] = copy_bandwidth_tbps()
    return st


def reject_pairs(pairs: Sequence[Mapping[str, Mapping[str, Any]]],
                 arms: Sequence[str] = ("native", "strict")) -> list[str | None]:
    """For each pair ``{arm: health}`` (``arms``, e.g. ``("pp", "rr")`` in the production
    benchmark): None if kept, else the reason. A probe that read nothing (no GPU, no NVML) keeps
    its pair: the envelope judges only what was measured."""
    bws = [p[a].get("copy_tbps") for p in pairs for a in arms if p[a].get("copy_tbps")]
    clocks = [p[a].get("sm_clock_mhz") for p in pairs for a in arms if p[a].get("sm_clock_mhz")]
    med_bw = sorted(bws)[len(bws) // 2] if bws else None
    top_clock = max(clocks) if clocks else None
    out: list[str | None] = []
    for p in pairs:
        reason = None
        for arm in arms:
            h = p[arm]
            bw = h.get("copy_tbps")
            if med_bw and bw and abs(bw - med_bw) > BANDWIDTH_TOLERANCE * med_bw:
                reason = f"{arm} copy bandwidth {bw:.2f} TB/s outside ±{BANDWIDTH_TOLERANCE:.0%} of {med_bw:.2f}"
            clk = h.get("sm_clock_mhz")
            if top_clock and clk and clk < CLOCK_FLOOR * top_clock:
                reason = f"{arm} SM clock {clk} MHz below {CLOCK_FLOOR:.0%} of {top_clock}"
        out.append(reason)
    return out
