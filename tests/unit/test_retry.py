"""Backoff and delay tiers: pure, seeded."""

import random
import statistics

import pytest

from consumers_sdk import retry
from consumers_sdk.retry import DEFAULT_TIERS, polynomial, tier_for, validate_tiers


def test_the_polynomial_backoff_follows_its_formula_and_is_capped() -> None:
    backoff = polynomial(base=15, cap=3600, rng=random.Random(1))
    for attempt in range(1, 7):
        delay = backoff(attempt)
        assert attempt**4 + 15 <= delay <= attempt**4 + 15 + 30 * (attempt + 1)
    assert backoff(8) == 3600  # 8**4 = 4096 is past the cap
    assert backoff(50) == 3600


def test_exponential_is_a_deprecated_name_for_the_same_backoff() -> None:
    with pytest.warns(DeprecationWarning, match="polynomial"):
        old = retry.exponential(base=15, cap=3600, rng=random.Random(9))
    new = polynomial(base=15, cap=3600, rng=random.Random(9))
    assert [old(attempt) for attempt in range(1, 9)] == [new(attempt) for attempt in range(1, 9)]


def test_backoff_grows_with_the_attempt() -> None:
    backoff = polynomial(rng=random.Random(7))
    medians = [statistics.median(backoff(attempt) for _ in range(200)) for attempt in (1, 3, 5)]
    assert medians == sorted(medians)
    assert medians[-1] > 10 * medians[0]


def test_jobs_failing_together_do_not_retry_in_lockstep() -> None:
    backoff = polynomial(rng=random.Random(3))
    delays = [backoff(2) for _ in range(100)]  # a hundred jobs failing from one cause
    assert max(delays) - min(delays) > 45  # the jitter spans 0 to 90 s at attempt 2
    assert polynomial(rng=random.Random(1))(3) != polynomial(rng=random.Random(2))(3)
    same = polynomial(rng=random.Random(5)), polynomial(rng=random.Random(5))
    assert same[0](4) == same[1](4), "seeded: reproducible"


def test_a_delay_rounds_up_to_the_next_tier() -> None:
    tiers = validate_tiers([5, 1, 60, 15, 5])
    assert tiers == (1, 5, 15, 60)
    assert tier_for(0, tiers) == 1
    assert tier_for(0.2, tiers) == 1
    assert tier_for(5, tiers) == 5
    assert tier_for(5.01, tiers) == 15
    assert tier_for(10_000, tiers) == 60, "past the longest tier: the longest"


def test_the_default_tiers_span_a_second_to_an_hour() -> None:
    assert min(DEFAULT_TIERS) == 1
    assert max(DEFAULT_TIERS) == 3600
    assert validate_tiers(DEFAULT_TIERS) == DEFAULT_TIERS


@pytest.mark.parametrize("tiers", [[], [0], [-1, 5], [float("inf")], [float("nan")], [0.0001]])
def test_invalid_tiers_are_refused(tiers: list[float]) -> None:
    with pytest.raises(ValueError, match="retry_tiers"):
        validate_tiers(tiers)


def test_doubling_pauses_double_from_the_first_up_to_the_cap_and_start_over_on_reset() -> None:
    pauses = retry.Doubling(first_s=0.2, max_s=5.0)
    assert [pauses.next() for _ in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert pauses.failures == 7
    pauses.reset()
    assert pauses.next() == 0.2


def test_doubling_stays_at_the_cap_however_long_it_fails() -> None:
    pauses = retry.Doubling(first_s=0.2, max_s=5.0)
    assert [pauses.next() for _ in range(5000)][-1] == 5.0


def test_doubling_with_a_random_source_stretches_each_pause_by_up_to_its_length() -> None:
    plain = retry.Doubling(first_s=0.2, max_s=5.0)
    jittered = retry.Doubling(first_s=0.2, max_s=5.0, rng=random.Random(3))
    pairs = [(plain.next(), jittered.next()) for _ in range(8)]
    assert all(pause <= stretched <= 2 * pause for pause, stretched in pairs)
    assert len({stretched / pause for pause, stretched in pairs}) == len(pairs)  # not in step
