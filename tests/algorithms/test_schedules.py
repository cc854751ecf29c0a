"""Loss-weight schedules against hand-derived values."""

import math

import pytest

from roll.algorithms.schedules import scheduled


def test_constant_is_the_value_at_every_step():
    assert [scheduled(0.1, "constant", s, 200) for s in (1, 100, 200, 500)] == [0.1] * 4


def test_linear_falls_by_value_over_max_steps_a_step():
    # step 1: 0.1; step 101: 0.1 * (1 - 100/200) = 0.05; step 200: 0.1 * 1/200 = 0.0005
    assert scheduled(0.1, "linear", 1, 200) == pytest.approx(0.1)
    assert scheduled(0.1, "linear", 101, 200) == pytest.approx(0.05)
    assert scheduled(0.1, "linear", 200, 200) == pytest.approx(0.0005)
    assert scheduled(0.1, "linear", 300, 200) == 0.0  # past max_steps (a resumed run): stays at 0


def test_cosine_is_the_cosine_lr_factor():
    # step 1: cos 0 = 1 -> 0.1; step 101: cos(pi/2) = 0 -> 0.05; step 151: cos(3pi/4) = -0.7071 -> 0.01464
    assert scheduled(0.1, "cosine", 1, 200) == pytest.approx(0.1)
    assert scheduled(0.1, "cosine", 101, 200) == pytest.approx(0.05)
    assert scheduled(0.1, "cosine", 151, 200) == pytest.approx(0.1 * (1 - math.sqrt(0.5)) / 2)
    assert scheduled(0.1, "cosine", 151, 200) == pytest.approx(0.014645, abs=1e-6)


def test_cosine_matches_the_transformers_cosine_lr_schedule_step_for_step():
    torch = pytest.importorskip("torch")
    from transformers import get_cosine_schedule_with_warmup

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    lr = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=200)
    for step in range(1, 201):  # pipeline step `step` trains at the scheduler's (step - 1)th value
        assert scheduled(0.1, "cosine", step, 200) == pytest.approx(lr.get_last_lr()[0])
        optimizer.step()
        lr.step()


def test_an_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown schedule 'exp'"):
        scheduled(0.1, "exp", 1, 200)  # type: ignore[arg-type]
