from rlk.bench import health


def _pair(bw_n, bw_s, clk_n=1980, clk_s=1980):
    return {"native": {"copy_tbps": bw_n, "sm_clock_mhz": clk_n}, "strict": {"copy_tbps": bw_s, "sm_clock_mhz": clk_s}}


def test_pairs_inside_envelope_are_kept_and_outliers_rejected():
    pairs = [_pair(4.2, 4.25), _pair(4.22, 4.2), _pair(3.0, 4.2), _pair(4.2, 4.2, clk_s=1400)]
    out = health.reject_pairs(pairs)
    assert out[0] is None and out[1] is None
    assert "native copy bandwidth 3.00" in out[2]
    assert "strict SM clock 1400" in out[3]


def test_missing_probes_do_not_reject():
    assert health.reject_pairs([{"native": {}, "strict": {}}]) == [None]


def test_bandwidth_probe_matches_the_machine():
    import torch

    bw = health.copy_bandwidth_tbps(nbytes=1 << 24, reps=3)
    if torch.cuda.is_available():
        assert bw is not None and bw > 0
    else:
        assert bw is None
