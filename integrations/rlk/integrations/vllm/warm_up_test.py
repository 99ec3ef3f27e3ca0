"""The strict model's serving warm-up: which logits row counts it compiles."""

from rlk.integrations.vllm.model import logp_row_counts


def test_logp_row_counts_cover_powers_of_two_their_successors_and_the_maximum():
    assert logp_row_counts(256) == [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256]
    assert logp_row_counts(20) == [1, 2, 3, 4, 5, 8, 9, 16, 17, 20]
    assert logp_row_counts(1) == [1]
    # Every row count up to the maximum has a warmed count of its power-of-two bucket and of its
    # divisibility by 16 (what Triton specializes an integer on).
    for top in (300, 256, 37):
        got = logp_row_counts(top)
        for t in range(1, top + 1):
            assert any(w.bit_length() == t.bit_length() and (w % 16 == 0) == (t % 16 == 0) for w in got), (top, t)
