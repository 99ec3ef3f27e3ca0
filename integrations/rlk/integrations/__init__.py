"""Engine adapters (megatron-core, vLLM): thin wiring of rlk modules into engine seams."""
