"""Triton kernels of rlk: one folder per op (``kernel.py``, ``launch.py``, ``reference.py``,
``config.py`` + ``configs/<arch>.json``). Kernels never import their references."""
