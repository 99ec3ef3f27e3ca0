"""rlk: strict, versioned arithmetic contracts for RL of large language models.

The ``rlk`` import root is spread over several source roots (``python/``, ``kernels/``,
``collectives/``, ``integrations/``); ``extend_path`` joins every ``rlk`` folder found on
``sys.path`` so that ``rlk.kernels`` and ``rlk.collectives`` resolve the same way under Bazel
(each root on ``sys.path``) and under ``pip install -e .``.
"""

import pkgutil as _pkgutil

__path__ = _pkgutil.extend_path(__path__, __name__)  # noqa: F821  (module attribute)

__version__ = "0.1.0"

from rlk.errors import (  # noqa: E402
    ContractMismatchError,
    ExactnessError,
    ProvenanceError,
    RlkError,
    UnsupportedConfigError,
)

__all__ = [
    "__version__",
    "RlkError",
    "UnsupportedConfigError",
    "ContractMismatchError",
    "ProvenanceError",
    "ExactnessError",
]
