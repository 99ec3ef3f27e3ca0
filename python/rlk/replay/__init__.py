"""Frozen-token replay: trainer pattern vs rollout pattern on the same weights and tokens."""
