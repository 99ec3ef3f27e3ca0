"""Contract ``logp.v2``: fused LM head + selected-token log-prob (no full logits), vocab-parallel
segment statistics with a fixed merge, entropy, and a deterministic backward."""
