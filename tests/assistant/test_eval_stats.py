"""The statistics behind the published figures (``assistant/evals/stats.py``): pass@k, a pass rate's
interval, the paired difference of two settings, and a speed-up's interval from interleaved chunks."""

from __future__ import annotations

import itertools
import math

import pytest

from assistant.evals import stats


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    for n, c, k in [(10, 3, 1), (10, 3, 5), (20, 0, 10), (5, 5, 2), (7, 2, 7)]:
        # The probability that k of n samples drawn without replacement hold at least one correct one.
        combos = list(itertools.combinations([True] * c + [False] * (n - c), k))
        expected = sum(any(x) for x in combos) / len(combos)
        assert math.isclose(stats.pass_at_k(n, c, k), expected, rel_tol=1e-9)


def test_pass_at_1_comes_with_its_95_percent_interval() -> None:
    # 45 of 1,033 (the reference decoder on the single-line infills): Wilson's interval, 3.3% to 5.8%.
    low, high = stats.confidence_interval([1.0] * 45 + [0.0] * 988)
    assert (round(low, 4), round(high, 4)) == (0.0327, 0.0578)
    low, high = stats.confidence_interval([0.0] * 100)  # none passed: still an upper bound
    assert low == 0.0 and 0.03 < high < 0.04
    # Several samples per task: the normal interval of the per-task rates' mean.
    low, high = stats.confidence_interval([0.5, 0.25, 0.75, 0.5])
    assert low < 0.5 < high and round(high - 0.5, 4) == round(1.96 * math.sqrt(1 / 24 / 4), 4)
    assert stats.confidence_interval([]) == (0.0, 0.0)


def test_the_paired_difference_is_over_the_same_tasks_and_stays_within_one() -> None:
    # Differences 1, 0, 0, 1: mean 0.5, sample variance 1/3; the upper end is cut at 1.
    mean, low, high = stats.paired([True, True, False, True], [False, True, False, False])
    assert mean == 0.5 and high == 1.0
    assert math.isclose(low, 0.5 - 1.96 * math.sqrt(1 / 3 / 4))
    assert stats.paired([True, False], [True, False]) == (0.0, 0.0, 0.0)  # no difference, no spread
    with pytest.raises(ValueError):
        stats.paired([True], [True, False])  # not the same tasks


def test_the_speed_up_interval_comes_from_the_chunks_paired_ratios() -> None:
    # Three chunks, the reference 10x slower in each up to noise: about 10x, an interval around it.
    result = stats.time_ratio([(100.0, 10.0), (110.0, 10.0), (90.0, 10.0)])
    assert result is not None
    mean, low, high = result
    assert abs(mean - 10.0) < 1e-9 and low < mean < high and 8.0 < low and high < 12.0
    # The same ratio in every chunk: no spread.
    result = stats.time_ratio([(50.0, 5.0), (80.0, 8.0)])
    assert result is not None
    assert round(result[0], 6) == round(result[1], 6) == round(result[2], 6) == 10.0
    assert stats.time_ratio([(100.0, 10.0)]) is None  # one chunk is no interval
    # The ratio of the totals, not the mean of the chunks' ratios (which would be (20 + 2) / 2 = 11).
    result = stats.time_ratio([(20.0, 1.0), (20.0, 10.0)])
    assert result is not None and math.isclose(result[0], 40 / 11)


def test_chunk_seconds_sums_each_chunks_tasks_for_both_settings() -> None:
    chunk_of = {"a": 0, "b": 0, "c": 1, "d": 1}
    ref = {t: {"seconds": s} for t, s in zip("abcd", (1.0, 2.0, 3.0, 4.0), strict=True)}
    this = {t: {"seconds": s} for t, s in zip("abcd", (0.5, 0.5, 1.0, 0.5), strict=True)}
    assert stats.chunk_seconds(["a", "b", "c", "d"], chunk_of, ref, this) == [(3.0, 1.0), (7.0, 1.5)]
    # Only the tasks asked for (those every setting answered, say) count.
    assert stats.chunk_seconds(["a", "c"], chunk_of, ref, this) == [(1.0, 0.5), (3.0, 1.0)]


def test_soft_scores_tell_apart_suggestions_that_are_all_wrong() -> None:
    from assistant.evals.stats import edit_similarity, first_line_right, soft_scores

    hidden = "    if not xs:\n        return 0\n"
    near = "    if not xs:\n        return None\n"  # wrong (fails the tests) but most of it right
    far = "    import os\n    print(os.name)\n"
    assert edit_similarity(hidden, hidden) == 1.0
    assert edit_similarity("\n" + hidden + "\n\n", hidden) == 1.0  # blank lines are no difference
    assert 0.8 < edit_similarity(near, hidden) < 1.0 and edit_similarity(far, hidden) < 0.6
    assert first_line_right(near, hidden) and not first_line_right(far, hidden)
    assert not first_line_right("", "")  # nothing suggested is not a right first line
    scores = soft_scores([near, near, far], [hidden] * 3, baseline=[far, far, far])
    low, high = scores["similarity_ci95"]
    assert low < scores["similarity"] < high and scores["first_line"] == 2 / 3
    mean, low, high = scores["similarity_minus_baseline"]
    assert mean > 0.25 and low <= mean <= high
    assert scores["first_line_minus_baseline"][0] == 2 / 3
    assert "similarity_minus_baseline" not in soft_scores([near], [hidden])
