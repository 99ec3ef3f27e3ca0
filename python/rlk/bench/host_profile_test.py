"""CPU smoke test of the host profiler: a tiny model's rollout under Triton's interpreter is
profiled for both routes and the text names the rollout entry point (no pickled stats)."""

from rlk.bench import host_profile_probe


def test_host_profile_text_names_the_rollout():
    for route in ("native", "strict"):
        text = host_profile_probe.profile_route(route, "rollout", 1, top=10, device="cpu", config="tiny", layers=1,
                                          sequences=2, prompt_range=(4, 8), response_range=(2, 3), max_batch=2)
        assert f"==== {route} rollout: 1 run(s), sorted by tottime" in text
        assert "run_rollout" in text
