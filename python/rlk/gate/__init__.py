"""The release gate: ladder levels registered by the code, run per profile, reported."""
