"""sm90_probe's choice of rows and configurations, on the CPU: the named M lists, and the
configurations an earlier probe keeps (``--configs-from``), refused where it would probe nothing."""

import json
import lzma

import pytest

from rlk.kernels.gemm import sm90, sm90_probe
from rlk.kernels.gemm.sm90_probe_select import M_DECODE, M_LIST, contenders, parse_m


def test_decode_names_every_batch_size_vllm_captures_up_to_256_and_keeps_the_long_rows():
    assert parse_m("decode") == list(M_DECODE)
    assert set(range(8, 257, 8)) <= set(M_DECODE) and {1, 2, 4} <= set(M_DECODE)
    assert [m for m in M_DECODE if 4 < m <= 256] == list(range(8, 257, 8))  # nothing between captures
    assert {m for m in M_LIST if m > 256} <= set(M_DECODE)
    assert parse_m("default") == list(M_LIST)
    assert parse_m("200, 64,default,64") == sorted(set(M_LIST))  # union, each M once
    assert parse_m("136,77") == [77, 136]
    for bad in ("", "0", "decode,-8", "prefill", "1.5"):
        with pytest.raises(ValueError, match="sm90_probe"):
            parse_m(bad)


def _row(times, differing=None):
    differing = differing or {}
    return {"configs": {n: ({"ms": t, "differing": differing.get(n, 0)} if t else {"error": "x"})
                        for n, t in times.items()}}


def test_contenders_are_the_configurations_near_a_rows_fastest_in_library_order():
    doc = {"rows": [
        _row({"a": 1.00, "b": 1.01, "c": 1.05, "d": None}),
        _row({"a": 2.00, "c": 1.00, "d": 1.50}, differing={"c": 3}),  # c's bytes differ: not fastest
    ]}
    # The margin is relative: 2.03 is within 2% of 2.0 (an absolute 0.02 would drop it).
    assert contenders([{"rows": [_row({"a": 2.0, "b": 2.03, "c": 2.05})]}], 0.02, ["a", "b", "c"]) == ["a", "b"]
    # A configuration no row timed (built after the probe) is kept; a library name is never invented.
    assert contenders([doc], 0.02, ["d", "c", "b", "a", "new"]) == ["d", "b", "a", "new"]
    assert contenders([doc], 0.0, ["a", "b", "c", "d"]) == ["a", "d"]  # d: the fastest with equal bytes in row 2
    assert contenders([doc], 0.06, ["a", "b", "c", "d"]) == ["a", "b", "c", "d"]
    # A second probe adds its own rows' contenders.
    assert contenders([doc, {"rows": [_row({"c": 1.0, "a": 3.0})]}], 0.0, ["a", "b", "c", "d"]) == ["a", "c", "d"]
    with pytest.raises(ValueError, match="within"):
        contenders([doc], -0.1, ["a"])
    with pytest.raises(ValueError, match="0 differing"):
        contenders([{"rows": [_row({"a": 1.0}, differing={"a": 1})]}], 0.02, ["a"])


def test_the_probe_runs_only_the_contenders_of_a_stored_probe(tmp_path, monkeypatch):
    """``--configs-from`` (an xz probe, as docs/results keeps them) picks the configurations the
    probe times, ``--m decode`` its rows; unknown names and an empty choice are refused before any
    GPU work."""
    names = list(sm90.CONFIGS)[:3]
    slow = {n: 9.0 for n in sm90.CONFIGS}  # the stored probe timed the whole library
    doc = {"rows": [_row({**slow, names[0]: 1.0, names[1]: 1.5, names[2]: 1.01})]}
    src = tmp_path / "old.json.xz"
    with lzma.open(src, "wt") as f:
        json.dump(doc, f)
    seen = {}

    def fake_probe(shapes, m_list, configs, out_path):
        seen.update(m=m_list, configs=configs)
        raise SystemExit(0)

    monkeypatch.setattr(sm90_probe, "probe", fake_probe)
    monkeypatch.setattr(sm90, "library", lambda: object())
    with pytest.raises(SystemExit):
        sm90_probe.main(["--out", str(tmp_path / "p.json"), "--m", "decode", "--configs-from", str(src)])
    assert seen == {"m": list(M_DECODE), "configs": [names[0], names[2]]}
    with pytest.raises(SystemExit):
        sm90_probe.main(["--out", str(tmp_path / "p.json"), "--configs", names[1], "--configs-from", str(src),
                         "--within", "0"])
    assert seen["configs"] == [names[1], names[0]]
    with pytest.raises(SystemExit):
        sm90_probe.main(["--out", str(tmp_path / "p.json"), "--configs", f" {names[2]}, {names[1]},"])
    assert seen["configs"] == [names[2], names[1]]
    seen.clear()
    for bad in (["--configs", "nope"], ["--m", "prefill"], ["--configs-from", str(src), "--within", "-1"],
                ["--configs", ""], ["--within", "0.1"], ["--configs-from", str(tmp_path / "missing.json")],
                ["--from-json", str(src), "--m", "decode"], ["--from-json", str(src), "--configs-from", str(src)]):
        with pytest.raises(SystemExit) as e:
            sm90_probe.main(["--out", str(tmp_path / "p.json"), *bad])
        assert e.value.code == 2 and not seen, bad
