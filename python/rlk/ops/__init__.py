"""Autograd functions and torch.library registrations of rlk ops (one module per op)."""
