"""RetryPolicy: backoff bounds per jitter mode, the max_delay cap, validation, retry_on."""

from __future__ import annotations

import dataclasses
import pickle
import random
import statistics

import pytest

from blitzq import ConfigurationError, Queue, Retry, RetryPolicy


class FixedDraw(random.Random):
    """A random source whose ``random()`` always returns ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def ceiling(policy: RetryPolicy, retry: int) -> float:
    """The un-jittered delay of retry number ``retry``."""
    return min(policy.max_delay, policy.base * policy.factor ** max(0, retry - 1))


LOW, HIGH = FixedDraw(0.0), FixedDraw(0.999999999)


def test_no_jitter_is_exponential() -> None:
    policy = RetryPolicy(base=0.5, factor=3.0, max_delay=1000, jitter="none")
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.5, 4.5, 13.5, 40.5]


def test_default_policy_is_full_jitter_from_one_second() -> None:
    policy = RetryPolicy()
    assert (policy.base, policy.factor, policy.jitter) == (1.0, 2.0, "full")
    assert 0.0 <= policy.delay(1) <= 1.0


@pytest.mark.parametrize("retry", [1, 2, 3, 5, 8, 12])
def test_full_jitter_bounds(retry: int) -> None:
    policy = RetryPolicy(base=0.2, factor=2.0, max_delay=60, jitter="full")
    top = ceiling(policy, retry)
    assert policy.delay(retry, LOW) == 0.0
    assert policy.delay(retry, HIGH) == pytest.approx(top)
    rng = random.Random(retry)
    draws = [policy.delay(retry, rng) for _ in range(2000)]
    assert all(0.0 <= d <= top for d in draws)
    assert statistics.fmean(draws) == pytest.approx(top / 2, rel=0.1)


@pytest.mark.parametrize("retry", [1, 2, 3, 5, 8, 12])
def test_equal_jitter_bounds(retry: int) -> None:
    policy = RetryPolicy(base=0.2, factor=2.0, max_delay=60, jitter="equal")
    top = ceiling(policy, retry)
    assert policy.delay(retry, LOW) == pytest.approx(top / 2)
    assert policy.delay(retry, HIGH) == pytest.approx(top)
    rng = random.Random(100 + retry)
    draws = [policy.delay(retry, rng) for _ in range(2000)]
    assert all(top / 2 <= d <= top for d in draws)
    assert statistics.fmean(draws) == pytest.approx(top * 0.75, rel=0.05)


@pytest.mark.parametrize("jitter", ["full", "equal", "none"])
def test_max_delay_caps_every_delay(jitter: str) -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, max_delay=10.0, jitter=jitter)  # type: ignore[arg-type]
    rng = random.Random(7)
    for retry in range(1, 60):
        assert policy.delay(retry, rng) <= 10.0
    assert policy.delay(50, HIGH) == pytest.approx(10.0)
    assert policy.delay(1000, HIGH) == pytest.approx(10.0)  # no overflow for huge retry numbers


def test_factor_one_gives_a_fixed_delay() -> None:
    policy = RetryPolicy(base=2.5, factor=1.0, jitter="none")
    assert {policy.delay(n) for n in range(1, 20)} == {2.5}


def test_zero_base_means_immediate_retries() -> None:
    policy = RetryPolicy(base=0.0, jitter="equal")
    assert policy.delay(5, HIGH) == 0.0


def test_retry_numbers_below_one_use_the_base_delay() -> None:
    policy = RetryPolicy(base=3.0, jitter="none")
    assert policy.delay(0) == policy.delay(-4) == policy.delay(1) == 3.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retries": -1},
        {"base": -0.1},
        {"max_delay": -1},
        {"factor": 0.5},
        {"factor": 0},
        {"jitter": "random"},
        {"jitter": ""},
    ],
    ids=repr,
)
def test_invalid_arguments_raise_configuration_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(factor=0.1)


def test_policy_is_frozen() -> None:
    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.base = 5.0  # type: ignore[misc]


def test_should_retry_by_exception_type() -> None:
    anything = RetryPolicy()
    assert anything.should_retry(ValueError())
    assert anything.should_retry(ConnectionError())
    assert not anything.should_retry(KeyboardInterrupt())
    assert not anything.should_retry(SystemExit())

    only_io = RetryPolicy(retry_on=(OSError,))
    assert only_io.should_retry(ConnectionResetError())
    assert not only_io.should_retry(ValueError())

    never_keys = RetryPolicy(retry_on=(LookupError,), dont_retry_on=(KeyError,))
    assert never_keys.should_retry(IndexError())
    assert not never_keys.should_retry(KeyError("k"))  # dont_retry_on is checked first


def test_task_retries_come_from_the_policy_when_it_sets_them() -> None:
    queue = Queue(redis_url="memory://test-retries")

    @queue.task(name="r.policy", retries=7, retry_policy=RetryPolicy(max_retries=2))
    def by_policy() -> None:
        return None

    @queue.task(name="r.task", retries=4, retry_policy=RetryPolicy())
    def by_task() -> None:
        return None

    @queue.task(name="r.none", retries=0)
    def no_retries() -> None:
        return None

    assert (by_policy.retries, by_policy.max_attempts) == (2, 3)
    assert (by_task.retries, by_task.max_attempts) == (4, 5)
    assert no_retries.max_attempts == 1
    with pytest.raises(ConfigurationError):
        queue.task(name="r.bad", retries=-1)(lambda: None)


def test_retry_exception_validates_its_delay() -> None:
    assert Retry().delay is None
    assert Retry(delay=0).delay == 0
    assert Retry(delay=1.5, reason="later").reason == "later"
    assert str(Retry(reason="busy")) == "busy"
    with pytest.raises(ConfigurationError):
        Retry(delay=-1)
    # A NaN or infinite delay would put the retry on the schedule at a time never reached.
    for delay in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ConfigurationError):
            Retry(delay=delay)


# ------------------------------------------------------------------- linear and fixed backoff
def test_linear_backoff_adds_the_base_per_retry() -> None:
    policy = RetryPolicy(base=2.0, backoff="linear", max_delay=1000, jitter="none")
    assert [policy.delay(n) for n in range(1, 6)] == [2.0, 4.0, 6.0, 8.0, 10.0]


def test_linear_backoff_with_an_increment() -> None:
    policy = RetryPolicy(base=1.0, increment=0.5, backoff="linear", jitter="none")
    assert [policy.delay(n) for n in range(1, 5)] == [1.0, 1.5, 2.0, 2.5]
    assert policy.delay(0) == policy.delay(-3) == 1.0  # below 1 counts as the first retry


def test_linear_backoff_is_capped_and_jittered() -> None:
    policy = RetryPolicy(base=10.0, backoff="linear", max_delay=25.0, jitter="full")
    assert policy.delay(2, HIGH) == pytest.approx(20.0)
    assert policy.delay(3, HIGH) == pytest.approx(25.0)
    assert policy.delay(10**6, HIGH) == pytest.approx(25.0)
    assert policy.delay(3, LOW) == 0.0
    equal = dataclasses.replace(policy, jitter="equal")
    assert equal.delay(2, LOW) == pytest.approx(10.0)


def test_fixed_backoff_ignores_the_factor() -> None:
    policy = RetryPolicy(base=3.0, factor=5.0, backoff="fixed", jitter="none")
    assert {policy.delay(n) for n in range(1, 30)} == {3.0}
    assert RetryPolicy(base=3.0, max_delay=2.0, backoff="fixed", jitter="none").delay(4) == 2.0


def test_exponential_stays_the_default_backoff() -> None:
    policy = RetryPolicy(base=1.0, jitter="none")
    assert policy.backoff == "exponential"
    assert [policy.delay(n) for n in range(1, 5)] == [1.0, 2.0, 4.0, 8.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backoff": "quadratic"},
        {"backoff": ""},
        {"increment": -1.0},
        {"increment": float("nan")},
        {"increment": float("inf")},
        {"increment": True},
        {"increment": "1"},
    ],
    ids=repr,
)
def test_invalid_backoff_arguments_raise_configuration_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_no_retry_is_never_retried() -> None:
    from blitzq import NoRetry

    assert not RetryPolicy().should_retry(NoRetry("bad input"))
    assert not RetryPolicy(retry_on=(NoRetry,)).should_retry(NoRetry())
    assert str(NoRetry()) == "the task asked not to be retried"
    assert NoRetry("why").reason == "why"


@pytest.mark.parametrize(
    "error",
    [Retry(), Retry(delay=2.5, reason="later"), Retry(delay=0)],
    ids=repr,
)
def test_retry_pickles_by_its_arguments(error: Retry) -> None:
    """A Retry crosses back from an ``executor="process"`` task as itself."""
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is Retry
    assert (back.delay, back.reason, str(back)) == (error.delay, error.reason, str(error))


def test_no_retry_pickles_by_its_reason() -> None:
    from blitzq import NoRetry

    for error in (NoRetry(), NoRetry("bad input")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is NoRetry
        assert (back.reason, str(back)) == (error.reason, str(error))
