import pytest

from roll.utils import polling
from roll.utils.polling import wait_until


class Clock:
    """time.monotonic and time.sleep of a test: sleeping moves the clock, nothing waits."""

    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(polling.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(polling.time, "sleep", clock.sleep)
    return clock


def test_the_first_answer_is_returned_without_waiting_longer(clock):
    answers = iter([None, None, "placed"])
    assert wait_until(lambda: next(answers), timeout_s=10.0, interval_s=0.5) == "placed"
    assert clock.sleeps == [0.5, 0.5]


def test_falsy_answers_count_as_answers(clock):
    assert wait_until(lambda: [], timeout_s=10.0, interval_s=1.0) == []
    assert clock.sleeps == []


def test_none_after_the_deadline_with_a_last_probe_at_or_after_it(clock):
    asked = []
    assert wait_until(lambda: asked.append(clock.now), timeout_s=0.6, interval_s=0.25) is None
    assert asked == [100.0, 100.25, 100.5, 100.75]  # 100.75 is past the deadline 100.6: give up


def test_a_timeout_of_zero_asks_once_and_never_sleeps(clock):
    asked = []
    assert wait_until(lambda: asked.append(1), timeout_s=0.0, interval_s=1.0) is None
    assert asked == [1] and clock.sleeps == []
