"""Thin nn.Modules over rlk.ops, used by the model and the engine adapters."""
