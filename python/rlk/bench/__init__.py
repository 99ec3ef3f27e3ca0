"""Paired P/P (native) vs R/R (strict) benchmarks on frozen replay work (the performance gate)."""
