"""FrozenLake's detour maps: which maps need one, `detour_prob`'s share of them, its refusals."""

import numpy as np
import pytest

from envs.frozen_lake.env import FrozenLakeEnv
from envs.frozen_lake.maps import generate_map, needs_detour, shortest_path_length

# S and G two cells apart with a hole between: the walk goes down, across and up (4 moves).
AROUND = ["SHG", "FFF"]


@pytest.mark.parametrize(
    ("desc", "expected"),
    [
        (AROUND, True),
        (["SFG", "FFF"], False),  # straight across
        (["SF", "HG"], False),  # the hole is off the path
        (["SHG"], False),  # unreachable
        (["SFF", "HHF", "GFF"], True),  # Manhattan 2, walk 6
    ],
)
def test_needs_detour(desc, expected):
    assert needs_detour(desc) is expected


def maps(detour_prob: float, count: int = 3000) -> list[list[str]]:
    return [generate_map(np.random.default_rng(seed), 4, 0.2, 8, detour_prob) for seed in range(count)]


def test_detour_prob_one_draws_only_solvable_detour_maps_within_the_path_bound():
    for desc in maps(1.0, 500):
        length = shortest_path_length(desc)
        assert needs_detour(desc) and length is not None and 4 <= length <= 8


def test_detour_prob_sets_the_share_of_detour_maps():
    natural = np.mean([needs_detour(desc) for desc in maps(0.0)])
    assert 0.04 < natural < 0.09  # the generator's own share on the example's 4x4 maps
    share = np.mean([needs_detour(desc) for desc in maps(0.25)])
    expected = 0.25 + 0.75 * natural  # the forced quarter, and the rest at the natural share
    assert abs(share - expected) < 0.025  # 3 standard errors of 3000 draws


def test_detour_prob_zero_draws_the_maps_of_a_run_without_the_key():
    for seed in range(50):
        assert generate_map(np.random.default_rng(seed), 4, 0.2, 8, 0.0) == generate_map(
            np.random.default_rng(seed), 4, 0.2, 8
        )
    assert maps(0.0, 200) != maps(0.5, 200)  # a positive share draws once more: other maps


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"detour_prob": 1.5}, r"detour_prob must be a number in \[0, 1\], got 1.5"),
        ({"detour_prob": True}, "detour_prob must be a number"),
        ({"detour_prob": 0.5, "size": 2}, "detour_prob > 0 needs maps that can need a detour"),
        ({"detour_prob": 0.5, "hole_prob": 0.0}, "detour_prob > 0 needs"),
        ({"detour_prob": 0.5, "hole_prob": 1.0}, "detour_prob > 0 needs"),
        ({"detour_prob": 0.5, "max_path_length": 3}, "max_path_length >= 4 or None"),
    ],
)
def test_detour_prob_refuses_shapes_without_detours(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FrozenLakeEnv(**kwargs)


def test_episode_metrics_count_detour_maps_and_their_solves():
    env = FrozenLakeEnv()
    env.reset(seed=0, options={"desc": AROUND})
    for move in ("Down", "Right", "Right", "Up"):
        info = env.step(f"<answer>{move}</answer>")[4]
    assert info["success"] and info["metrics"]["detour_map"] == info["metrics"]["detour_solved"] == 1.0
    env.reset(seed=0, options={"desc": AROUND})
    info = env.step("<answer>Right</answer>")[4]  # into the hole
    assert (info["metrics"]["detour_map"], info["metrics"]["detour_solved"]) == (1.0, 0.0)
    forced = FrozenLakeEnv(detour_prob=1.0, max_path_length=8)
    for seed in range(20):
        forced.reset(seed=seed)
        assert forced.step("noise")[4]["metrics"]["detour_map"] == 1.0  # an invalid move: no change
