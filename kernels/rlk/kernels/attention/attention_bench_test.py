"""attention_bench's sites A/B bookkeeping on the CPU (stand-in timers; the bench itself needs a GPU).

Checks what a device call cannot afford to find broken: the off / on arms alternate per round, each
arm's calls run with launch sites set as labelled, the process setting is restored, the medians are
taken per arm and mode, and site hits are counted from launcher.STATS.
"""

from rlk.kernels import launcher
from rlk.kernels.attention import attention_bench as AB


def test_sites_ab_alternates_arms_sets_the_switch_and_takes_medians(monkeypatch):
    seen = []  # (mode, sites setting while the arm's fn ran)
    clock = iter(range(1, 1000))

    def stand_in(mode):
        def measure(fn):
            fn()
            return float(next(clock))
        return measure

    def strict():
        seen.append(launcher.sites_enabled())
        launcher.STATS["site_hits"] += 1 if launcher.sites_enabled() else 0

    monkeypatch.setitem(launcher.STATS, "site_hits", 5)  # earlier hits in the process are not counted
    monkeypatch.setattr(AB, "_bench", stand_in("eager"))
    monkeypatch.setattr(AB, "_b2b", stand_in("b2b"))
    monkeypatch.setattr(AB, "_graph_bench", stand_in("graph"))
    prev = launcher.set_sites_enabled(True)  # the process setting, restored after each arm
    try:
        hits0 = launcher.STATS["site_hits"]
        r = AB._sites_ab(strict, rounds=3)
        assert launcher.sites_enabled() is True
    finally:
        launcher.set_sites_enabled(prev)
    # Per round: eager, b2b, graph of "off", then of "on"; 3 rounds.
    assert seen == ([False] * 3 + [True] * 3) * 3
    # The clock gives each measurement the next integer: round k's off arm gets 6k+1..6k+3 and
    # its on arm 6k+4..6k+6 (eager, b2b, graph).
    assert r["sites_ab"]["eager"] == {"off": [1.0, 7.0, 13.0], "on": [4.0, 10.0, 16.0]}
    assert r["sites_ab"]["graph"] == {"off": [3.0, 9.0, 15.0], "on": [6.0, 12.0, 18.0]}
    assert r["strict_nosites_eager_us"] == 7.0 and r["strict_sites_eager_us"] == 10.0
    assert r["strict_nosites_b2b_us"] == 8.0 and r["strict_sites_b2b_us"] == 11.0
    assert hits0 == 5 and r["site_hits"] == 9 and launcher.STATS["site_hits"] == 14
