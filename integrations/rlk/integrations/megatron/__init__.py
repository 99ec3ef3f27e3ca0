"""megatron-core integration: strict spec provider, selected-token logp output processor,
exact weight conversion, fail-closed config guard and audits.

Modules: :mod:`.spec` (build), :mod:`.modules` (slot adapters), :mod:`.logp` (output
processor), :mod:`.weights` (HF <-> megatron, per-rank shards), :mod:`.audit` (post-build and
forward audits), :mod:`.actor` (the actor: megatron's DDP, schedule and optimizer over the
strict model, the LM head's d_weight accumulated into ``main_grad``), :mod:`.native` (megatron's
own local-spec trainer, the baseline), :mod:`.rl_trainer` (the RL loop's actor on either), :mod:`.check` (the CPU
check CLI), :mod:`.replay` (frozen replay: rlk's strict
rollout fixture re-scored by the megatron-core trainer; the H200 CLI). megatron-core itself is
imported lazily.
"""


def version() -> str | None:
    """megatron-core's version from its package metadata (None when it is not installed).
    megatron's own ``package_info.__version__`` appends the short hash of the git checkout the
    process runs in, i.e. the caller's repository, not megatron's: records never use it."""
    import importlib.metadata

    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None
