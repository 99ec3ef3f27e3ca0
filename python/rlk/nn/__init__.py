"""Thin nn.Modules over the ops' autograd entry points (``rlk.kernels.<op>.autograd``), used by
the model and the engine adapters."""
