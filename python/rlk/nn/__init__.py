"""Tensor- and context-parallel layers over the ops' autograd entry points and the fixed-order
collectives: ``tensor_parallel`` (``copy_to_tp``, ``reduce_from_tp`` and the TP layers the L3
gate check runs) and ``context_parallel`` (the zigzag layout and CP-local-row attention), used
by the megatron adapter."""
