"""Test helper of the megatron-core integration (imports no megatron module at load time)."""

from __future__ import annotations

import os


def require_megatron() -> None:
    """Skips the calling test when megatron-core is missing, with the reason; fails instead when
    ``CI`` is set (CI installs it through ci/setup_megatron.sh, so a missing one is a defect)."""
    import pytest

    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        msg = f"megatron-core 0.19.2 is not installed ({e}); run ci/setup_megatron.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
