"""Typed errors of strict mode. Strict mode raises; it never falls back silently."""


class RlkError(Exception):
    """Base class of every error rlk raises on purpose."""


class UnsupportedConfigError(RlkError, ValueError):
    """A requested dtype, shape, head dim, page size, topology or setting is outside every
    registered contract. Raised when an execution plan is built or before a kernel launch."""


class ContractMismatchError(RlkError):
    """Two sides (engines, ranks, arms) use different contract IDs, or a contract ID is
    unknown or malformed."""


class ProvenanceError(RlkError):
    """A provenance record is missing, stale, or does not match the one it is paired with."""


class ExactnessError(RlkError, AssertionError):
    """Two results that a contract says are bitwise equal are not."""
