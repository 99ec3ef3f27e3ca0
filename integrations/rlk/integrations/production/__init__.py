"""Paired P/P vs R/R on the production stack, one GPU: vLLM rollout + megatron-core trainer.

* P/P: stock vLLM, megatron-core's native trainer (local spec, torch varlen flash attention);
  old logp recomputed by a trainer forward.
* R/R: vLLM with rlk's plugin, megatron-core on rlk's strict spec; old logp reused from the
  rollout, only when the actor forward gives the same fp32 bytes for every token (fails closed
  otherwise).

``python -m rlk.integrations.production.bench`` (:mod:`rlk.integrations.production.bench`) runs
it; ``attention`` holds the native arm's packed core attention, ``records`` the files both
halves share.
"""
