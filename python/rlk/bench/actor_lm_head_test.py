"""CPU smoke test of the actor-phase benchmark (tiny model under Triton's interpreter): the arms
run, the fused strict actor's logp and gradients equal the unfused ones bitwise, and the report
has the fields the closing notes cite. Timings here mean nothing."""

from rlk.bench import actor_lm_head_bench


def test_actor_lm_head_reports_equal_fused_and_unfused_arms():
    res = actor_lm_head_bench.run(1, "cpu", config="tiny", layers=1, sequences=2, prompt_range=(6, 12),
                            response_range=(3, 6), max_batch=2)
    assert res["fused_logp_equals_unfused"] is True
    assert res["fused_grads_differing"] == []
    assert set(res["median_ms"]) == {"native", "strict_unfused", "strict_fused"}
    assert all(len(v) == 1 for v in res["rounds_ms"].values())  # the warm-up round is dropped
    assert res["ratio_fused_vs_unfused"] > 0 and res["provenance"]["route"] == "strict"
