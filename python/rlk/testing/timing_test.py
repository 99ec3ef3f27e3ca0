"""interleaved_us: rounds alternate between the functions; medians, spread and errors reported."""

import pytest

from rlk.testing.timing import back_to_back_us, cold_graph_us, interleaved_us, switched


def test_rounds_alternate_and_report_medians():
    order, clock = [], iter([5.0, 1.0, 3.0, 2.0, 4.0, 9.0])

    def measure(fn):
        order.append(fn())
        return next(clock)

    out = interleaved_us({"a": lambda: "a", "b": lambda: "b"}, rounds=3, measure=measure)
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert out["a"] == {"us": 4.0, "min": 3.0, "max": 5.0, "rounds": [5.0, 3.0, 4.0]}
    assert out["b"]["us"] == 2.0 and out["b"]["rounds"] == [1.0, 2.0, 9.0]


def test_a_failing_fn_is_reported_and_the_others_go_on():
    def bad():
        raise RuntimeError("no kernel")

    out = interleaved_us({"bad": bad, "ok": lambda: 0}, rounds=2, measure=lambda fn: (fn(), 1.5)[1])
    assert "no kernel" in out["bad"]["error"]
    assert out["ok"]["us"] == 1.5


def test_back_to_back_times_the_loop_once_and_divides():
    """One warm-up call and a sync before the timer starts; the timer spans exactly ``calls``
    calls with nothing between them (no sync, no flush)."""
    log = []

    def timer():
        log.append("start")
        return lambda: (log.append("stop"), 500.0)[1]

    us = back_to_back_us(lambda: log.append("call"), calls=4, sync=lambda: log.append("sync"), timer=timer)
    assert log == ["call", "sync", "start", "call", "call", "call", "call", "stop"]
    assert us == 125.0
    with pytest.raises(ValueError, match="calls"):
        back_to_back_us(lambda: None, calls=0, sync=lambda: None, timer=timer)


def test_cold_graph_subtracts_the_flush_alone():
    """Graph of (flush, fn) per call minus graph of flush per call: fn's cold time; the flush
    runs before every fn call inside the first graph."""
    log = []

    def graph_us(f, calls):  # stand-in: device time = 7 per flush, 3 per fn, per call
        log.clear()
        for _ in range(calls):
            f()
        return (7.0 * log.count("flush") + 3.0 * log.count("fn")) / calls

    def fn():
        log.append("fn")

    us = cold_graph_us(fn, calls=4, flush=lambda: log.append("flush"), graph_us=graph_us)
    assert us == 3.0
    seen = []
    cold_graph_us(lambda: seen.append("fn"), calls=2, flush=lambda: seen.append("flush"),
                  graph_us=lambda f, calls: ([f() for _ in range(calls)], 0.0)[1])
    assert seen == ["flush", "fn", "flush", "fn", "flush", "flush"]


def test_switched_sets_for_the_call_and_restores_even_on_error():
    state = {"on": True}

    def set_enabled(v):
        prev, state["on"] = state["on"], v
        return prev

    assert switched(lambda: state["on"], set_enabled, False)() is False
    assert state["on"] is True

    def boom():
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        switched(boom, set_enabled, False)()
    assert state["on"] is True
