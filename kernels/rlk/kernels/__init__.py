"""Triton kernels of rlk: one folder per op holds everything of that op (``contract.py``,
``schedule.py`` + ``configs/<arch>.json``, ``kernel*.py``, ``launch.py``, ``autograd.py``,
``reference.py``, tests). Kernels never import their references."""
