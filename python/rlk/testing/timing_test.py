"""interleaved_us: rounds alternate between the functions; medians, spread and errors reported."""

from rlk.testing.timing import interleaved_us


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
