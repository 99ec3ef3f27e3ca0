"""Models built only from rlk modules."""
