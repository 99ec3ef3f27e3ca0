"""rlk's vLLM adapter: general plugin (``plugin.register``), strict Qwen3 model class
(``model.RlkStrictQwen3ForCausalLM``), request gate and engine-config checks (``gate``), run-time
kernel counters (``counters``), KV layout views (``kv_layout``), the CPU check CLI (``check``).

Importing this package imports nothing from vLLM; ``model`` and ``request_gate`` do.
"""
