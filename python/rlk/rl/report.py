"""Reports of the RL loop: the JSON record, a one-line step summary and the PNG of both arms."""

from __future__ import annotations

import json
import math
import os

ROUTE_COLORS = {"strict": "tab:blue", "native": "tab:orange"}


def step_line(rec: dict) -> str:
    """A short human line of one step record (the progress bar's postfix and the plain-text log)."""
    dev = rec.get("abs_dev", {})
    return (f"{rec['route']} step {rec['step']}: reward {rec['reward_mean']:.3f}, ratio_not_one "
            f"{rec['ratio_not_one']}/{rec['tokens']}, logp_mismatch {rec['logp_mismatch']}, |ratio-1| max "
            f"{dev.get('max', 0.0):.3g}, loss {rec['loss']:.4f}, sync {rec['sync']['sha256_rollout'][:12]} "
            f"{'ok' if rec['sync']['match'] else 'MISMATCH'}, {rec['seconds']['step']:.1f} s")


def write_json(report: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2, sort_keys=True, default=str)
    return path


def arm_names(arms: dict, key: str) -> str | None:
    """``route: name`` of each arm's ``key`` record (``"engine"``: its rollout engine, ``"actor"``:
    its trainer); None when no arm has the record, ``route: <key> not recorded`` for an arm
    without it (a report written before it existed) beside one with it."""
    if not any(arm.get(key) for arm in arms.values()):
        return None
    return "; ".join(f"{route}: {arm[key]['name'] if arm.get(key) else f'{key} not recorded'}"
                     for route, arm in arms.items())


def plot_title(lc, engine: str | None = None, actor: str | None = None) -> str:
    """The PNG's title: model (``lc``: the loop's ``LoopConfig``), each arm's actor and rollout
    engine, task and batch."""
    return (f"rlk RL loop on {lc.describe_model()}{f', actor: {actor}' if actor else ''}"
            f"{f', rollout engine: {engine}' if engine else ''}, "
            f"reward: {lc.task().reward_rule()}, "
            f"{lc.prompts_per_step} prompt(s) x "
            f"{lc.group_size} samples x {lc.response_len} tokens, lr {lc.lr}, seed {lc.seed}")


def title_of(lc, arms: dict) -> str:
    """:func:`plot_title` with the arms' recorded engines and actors."""
    return plot_title(lc, arm_names(arms, "engine"), arm_names(arms, "actor"))


def plot(arms: dict[str, dict], path: str, title: str = "", reward_rule: str = "reward") -> str | None:
    """Reward and importance-ratio statistics per step of each arm (``{route: run_arm result}``);
    ``reward_rule``: the task's reward in words. Returns ``path``, or ``None`` when matplotlib is
    not importable (the caller says so)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(1, 4, figsize=(19, 4.2))
    for route, arm in arms.items():
        steps = arm["steps"]
        x = [r["step"] for r in steps]
        c = ROUTE_COLORS.get(route)
        ax[0].plot(x, [r["reward_mean"] for r in steps], "o-", color=c, label=f"{route}: mean")
        ax[0].fill_between(x, [r["reward_min"] for r in steps], [r["reward_max"] for r in steps], color=c, alpha=0.15)
        ax[1].plot(x, [r["ratio_not_one"] for r in steps], "o-", color=c, label=f"{route}: ratio != 1")
        ax[1].plot(x, [r["logp_mismatch"] for r in steps], "x--", color=c, label=f"{route}: logp bits differ")
        for key, style in (("max", "o-"), ("p99", "s--"), ("p50", "^:")):
            ax[2].plot(x, [r.get("abs_dev", {}).get(key, 0.0) for r in steps], style, color=c,
                       label=f"{route}: {key}")
        ax[3].plot(x, [r.get("entropy_mean", float("nan")) for r in steps], "o-", color=c, label=route)
    ax[0].set(title=f"reward ({reward_rule}): mean, min-max", xlabel="step", ylabel="reward", ylim=(-0.02, 1.02))
    ax[1].set(title="tokens with ratio != 1 / logp bits differing", xlabel="step", ylabel="tokens")
    ax[2].set(title="|ratio - 1|, ratio = exp(logp_train - logp_rollout)", xlabel="step",
              ylabel="|ratio - 1|")
    ax[2].set_yscale("symlog", linthresh=1e-8)
    ax[3].set(title="sampling entropy (nats, mean over response tokens)", xlabel="step", ylabel="nats")
    silent = [route for route, arm in arms.items() if arm["steps"]
              and not any(math.isfinite(r.get("entropy_mean", float("nan"))) for r in arm["steps"])]
    if silent:
        # vLLM returns the sampled token's logp only: no entropy to draw for its arms.
        ax[3].text(0.5, 0.5, f"not reported by the rollout engine ({', '.join(silent)})", ha="center",
                   va="center", transform=ax[3].transAxes, fontsize=8)
    for a in ax:
        a.title.set_fontsize(10)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
