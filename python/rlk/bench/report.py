"""Benchmark reports: Markdown + JSON (with both arms' provenance), per-step CSV, phase plot."""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Mapping, Sequence


def write_csv(path: str, steps: Sequence[Mapping[str, Any]]) -> None:
    if not steps:
        return
    cols = sorted({k for s in steps for k in s})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for s in steps:
            w.writerow(s)


def plot_phases(path: str, phase_medians: Mapping[str, Mapping[str, float]], title: str) -> bool:
    """Stacked bar of per-phase median times per arm. Returns False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    arms = list(phase_medians)
    phases = sorted({p for a in arms for p in phase_medians[a]})
    fig, ax = plt.subplots(figsize=(7, 4))
    bottoms = [0.0] * len(arms)
    for ph in phases:
        vals = [phase_medians[a].get(ph, 0.0) * 1e3 for a in arms]
        ax.bar(arms, vals, bottom=bottoms, label=ph)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_ylabel("median time per step (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_json(path: str, report: Mapping[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2, default=str)


def markdown(report: Mapping[str, Any]) -> str:
    lines = [f"# {report.get('title', 'rlk paired benchmark')}", ""]
    lines.append(f"Target: R/R <= {report.get('target')} x P/P (upper bound of the 95% interval).")
    lines.append("")
    lines.append("| variant | ratio R/R / P/P | 95% CI | verdict |")
    lines.append("| --- | --- | --- | --- |")
    for name, key in (("no reuse", "ratio"), ("rollout-logp reuse", "ratio_reuse")):
        if report.get(key) is not None:
            lo, hi = report[f"{key}_ci95"]
            ok = hi <= report.get("target", 1.0)
            lines.append(f"| {name} | {report[key]:.3f} | [{lo:.3f}, {hi:.3f}] | {'met' if ok else 'missed'} |")
    lines += ["", "| phase | P/P median (ms) | R/R median (ms) | ratio |", "| --- | --- | --- | --- |"]
    pm = report.get("phase_medians_s", {})
    for ph in sorted(pm.get("native", {})):
        n, s = pm["native"][ph], pm.get("strict", {}).get(ph)
        if s is None:
            continue
        lines.append(f"| {ph} | {n * 1e3:.2f} | {s * 1e3:.2f} | {s / n:.3f} |")
    for k in ("p95_step_s", "tokens_per_s", "pairs_rejected", "equality"):
        if k in report:
            lines += ["", f"**{k}**: `{json.dumps(report[k], default=str)}`"]
    prov = report.get("provenance", {})
    if prov:
        lines += ["", "Provenance fingerprints (route excluded must match): " + ", ".join(
            f"{a}: `{p.get('fingerprint', '')[:16]}`" for a, p in prov.items())]
    return "\n".join(lines) + "\n"


def write_all(out_dir: str, report: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], stem: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, f"{stem}.json"), "md": os.path.join(out_dir, f"{stem}.md"),
             "csv": os.path.join(out_dir, f"{stem}_steps.csv"), "png": os.path.join(out_dir, f"{stem}.png")}
    write_json(paths["json"], report)
    with open(paths["md"], "w") as f:
        f.write(markdown(report))
    write_csv(paths["csv"], steps)
    if not plot_phases(paths["png"], report.get("phase_medians_s", {}), report.get("title", "")):
        paths.pop("png")
    return paths
