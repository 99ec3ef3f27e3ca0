"""``python -m rlk.integrations.production.bench``: the paired P/P vs R/R benchmark on the
production stack (vLLM rollout + megatron-core trainer, one GPU). The command line, its usage
and the method are in ``__main__.py`` (a package, so that the tool stays a leaf module:
ARCHITECTURE.md, "Layers")."""
