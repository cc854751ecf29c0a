"""FrozenLake: exact transitions, seeded determinism, solvable maps, slippery frequencies."""

import warnings
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  registers the built-ins (the entry point may not be installed)
from envs.frozen_lake.env import FrozenLakeEnv
from envs.frozen_lake.maps import generate_map, shortest_path_length

# Start (0, 0), goal (3, 3), holes at (0, 3), (1, 1), (2, 3), (3, 0).
DESC = ["SFFH", "FHFF", "FFFH", "HFFG"]
# Start in the centre with open ice on all four sides; the goal is not one move away.
OPEN = ["FFF", "FSF", "FFG"]


def answer(move: str) -> str:
    return f"<answer>{move}</answer>"


@pytest.mark.parametrize(
    ("desc", "expected"),
    [
        (["SFG"], 2),
        (["SHG"], None),
        (["SH", "FG"], 2),
        (["SFF", "HHF", "GFF"], 6),  # the only way round the holes
        (DESC, 6),
    ],
)
def test_shortest_path_length(desc, expected):
    assert shortest_path_length(desc) == expected


def test_reset_renders_the_given_map():
    env = FrozenLakeEnv()
    obs, info = env.reset(seed=0, options={"desc": DESC})
    assert obs == "P__O\n_O__\n___O\nO__G"
    assert info == {"env_instruction": FrozenLakeEnv.instruction, "metrics": {}}
    assert not env.success


@pytest.mark.parametrize(
    ("move", "expected_obs"),
    [
        ("Left", "___\nP__\n__G"),
        ("Down", "___\n___\n_PG"),
        ("Right", "___\n__P\n__G"),
        ("Up", "_P_\n___\n__G"),
    ],
)
def test_each_move(move, expected_obs):
    env = FrozenLakeEnv()
    env.reset(seed=0, options={"desc": OPEN})
    obs, reward, terminated, truncated, info = env.step(answer(move))
    assert (obs, reward, terminated, truncated) == (expected_obs, 0.0, False, False)
    assert info["action_is_valid"] is True and info["success"] is False


def test_wall_bump_then_hole():
    env = FrozenLakeEnv()
    start, _ = env.reset(seed=0, options={"desc": DESC})
    for move in ("Left", "Up"):  # both walls of the corner: stay in place
        assert env.step(answer(move))[:4] == (start, 0.0, False, False)
    assert env.step(answer("Right"))[:4] == ("_P_O\n_O__\n___O\nO__G", 0.0, False, False)
    obs, reward, terminated, truncated, info = env.step(answer("Down"))
    assert (obs, reward, terminated, truncated) == ("___O\n_X__\n___O\nO__G", 0.0, True, False)
    metrics = {"num_actions": 4.0, "num_invalid": 0.0, "fell_in_hole": 1.0, "shortest_path": 6.0}
    metrics |= {"detour_map": 0.0, "detour_solved": 0.0}  # 6 moves: the Manhattan distance
    assert info == {"action_is_valid": True, "success": False, "metrics": metrics}
    # the episode is over: further moves change nothing and pay nothing
    assert env.step(answer("Right"))[:4] == (obs, 0.0, True, False)


def test_reach_goal():
    env = FrozenLakeEnv()
    env.reset(seed=0, options={"desc": DESC})
    for move in ("Down", "Down", "Right", "Right", "Down"):
        assert env.step(answer(move))[1:3] == (0.0, False)
    obs, reward, terminated, truncated, info = env.step(answer("Right"))
    assert (obs, reward, terminated, truncated) == ("___O\n_O__\n___O\nO__√", 1.0, True, False)
    assert env.success and info["success"] is True
    assert info["metrics"] == {
        "num_actions": 6.0,
        "num_invalid": 0.0,
        "fell_in_hole": 0.0,
        "shortest_path": 6.0,
        "detour_map": 0.0,
        "detour_solved": 0.0,
    }


def test_invalid_action_changes_nothing():
    env = FrozenLakeEnv(format_penalty=-0.5)
    start, _ = env.reset(seed=0, options={"desc": OPEN})
    for text in ("Left", "<answer>Jump</answer>", "", "<answer>"):
        obs, reward, terminated, truncated, info = env.step(text)
        assert (obs, reward, terminated, truncated) == (start, -0.5, False, False)
        assert info["action_is_valid"] is False
    assert info["metrics"]["num_invalid"] == 4.0
    # the player is still in the centre
    assert env.step(answer("Up"))[0] == "_P_\n___\n__G"


def rollout(env: FrozenLakeEnv, seed: int, script: list[str]) -> list:
    transitions = [env.reset(seed=seed)]
    for text in script:
        transitions.append(env.step(text))
        if transitions[-1][2]:
            break
    return transitions


@pytest.mark.parametrize("is_slippery", [False, True])
def test_same_seed_same_rollout(is_slippery):
    script = [answer(m) for m in ("Right", "Down", "Down", "Left", "Right", "Up")] + ["noise"]
    script = script * 3
    first = rollout(FrozenLakeEnv(size=5, is_slippery=is_slippery), 11, script)
    again = rollout(FrozenLakeEnv(size=5, is_slippery=is_slippery), 11, script)
    assert first == again and len(first) > 2


def test_different_seeds_different_maps():
    env = FrozenLakeEnv(size=4)
    maps = {env.reset(seed=seed)[0] for seed in range(50)}
    assert len(maps) == 50


@pytest.mark.parametrize(("size", "hole_prob", "max_path_length"), [(4, 0.2, None), (6, 0.4, None), (6, 0.3, 3)])
def test_generated_maps_are_solvable(size, hole_prob, max_path_length):
    starts, lengths = Counter(), Counter()
    for seed in range(2000):
        desc = generate_map(np.random.default_rng(seed), size, hole_prob, max_path_length)
        assert len(desc) == size and all(len(row) == size for row in desc)
        text = "".join(desc)
        assert set(text) <= set("SFHG") and text.count("S") == 1 and text.count("G") == 1
        length = shortest_path_length(desc)
        assert length is not None and length >= 1
        assert max_path_length is None or length <= max_path_length
        starts[text.index("S")] += 1
        lengths[length] += 1
    assert len(starts) == size * size  # the start is not pinned to a corner
    if max_path_length is not None:
        assert set(lengths) == set(range(1, max_path_length + 1))


def test_slippery_moves_one_third_each_way():
    env = FrozenLakeEnv(is_slippery=True)
    env.reset(seed=0)
    where = {"___\nP__\n__G": "Left", "___\n___\n_PG": "Down", "___\n__P\n__G": "Right"}
    counts = Counter()
    for _ in range(3000):
        env.reset(options={"desc": OPEN})  # no seed: the rng carries on
        counts[where.get(env.step(answer("Down"))[0], "other")] += 1
    assert set(counts) == {"Left", "Down", "Right"}  # never backwards (Up)
    for move in ("Left", "Down", "Right"):
        assert 850 < counts[move] < 1150  # 1000 expected, sd 26


def test_bad_arguments():
    with pytest.raises(ValueError, match="size"):
        FrozenLakeEnv(size=1)
    with pytest.raises(ValueError, match="hole_prob"):
        FrozenLakeEnv(hole_prob=1.5)
    with pytest.raises(ValueError, match="max_path_length"):
        FrozenLakeEnv(max_path_length=0)
    with pytest.raises(ValueError, match="render_mode"):
        FrozenLakeEnv(render_mode="human")
    env = FrozenLakeEnv()
    with pytest.raises(ValueError, match="no path"):
        env.reset(options={"desc": ["SHG"]})
    with pytest.raises(ValueError, match="exactly one S"):
        env.reset(options={"desc": ["SFF", "FFS", "FFG"]})
    with pytest.raises(gym.error.ResetNeeded):
        FrozenLakeEnv().step(answer("Up"))


def test_render_ansi():
    env = FrozenLakeEnv(render_mode="ansi")
    env.reset(options={"desc": OPEN})
    env.step(answer("Left"))
    assert env.render() == "___\nP__\n__G"
    assert FrozenLakeEnv().render() is None


@pytest.mark.parametrize("config", [{"is_slippery": True, "size": 6, "max_path_length": 4}])
def test_check_env_non_default_config(config):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make("roll/FrozenLake-v0", **config).unwrapped)


def play_scripted(env: FrozenLakeEnv) -> tuple[list[str], dict]:
    """Follow `scripted_action` until it has no move; the moves made and the last info."""
    moves, info = [], {}
    while (action := env.scripted_action()) is not None:
        moves.append(action)
        info = env.step(action)[4]
    return moves, info


def test_scripted_action_follows_the_first_shortest_move_in_action_order():
    env = FrozenLakeEnv()
    assert env.scripted_action() is None  # before any reset
    env.reset(seed=0, options={"desc": DESC})
    # distances to G: (0,0) 6, (1,0) 5, (2,0) 4, (2,1) 3, then (3,1) and (2,2) both 2: Down first
    moves, info = play_scripted(env)
    assert moves == [answer(m) for m in ("Down", "Down", "Right", "Down", "Right", "Right")]
    assert info["success"] is True
    env.reset(seed=0, options={"desc": DESC})
    env.step(answer("Right"))
    env.step(answer("Down"))  # into the hole at (1, 1)
    assert env.scripted_action() is None


@pytest.mark.parametrize(("size", "hole_prob"), [(4, 0.2), (6, 0.4)])
def test_scripted_agent_solves_every_map_in_shortest_path_moves(size, hole_prob):
    env = FrozenLakeEnv(size=size, hole_prob=hole_prob)
    for seed in range(200):
        env.reset(seed=seed)
        moves, info = play_scripted(env)
        assert info["success"] is True, seed
        assert len(moves) == info["metrics"]["shortest_path"] == info["metrics"]["num_actions"]


def test_frame_to_rgb_colours_each_cell():
    image = FrozenLakeEnv.frame_to_rgb("P__O\n_O__\n___O\nO__√")
    assert image.shape == (128, 128, 3) and image.dtype == np.uint8

    def corner(row, col):  # inside the cell's 1-pixel outline, away from the centred symbol
        return tuple(image[row * 32 + 3, col * 32 + 3])

    assert corner(0, 0) == (220, 50, 50)  # player: red
    assert corner(0, 1) == (200, 230, 250)  # ice: light blue
    assert corner(0, 3) == (40, 70, 150)  # hole: dark blue
    assert corner(3, 3) == (255, 200, 0)  # player on the goal: gold
    assert tuple(FrozenLakeEnv.frame_to_rgb("G")[3, 3]) == (60, 180, 75)  # goal: green


def test_render_rgb_array():
    env = FrozenLakeEnv(render_mode="rgb_array")
    assert env.render() is None  # nothing to draw before a reset
    obs, _ = env.reset(seed=0, options={"desc": OPEN})
    image = env.render()
    assert image.shape == (96, 96, 3) and image.dtype == np.uint8
    assert np.array_equal(image, FrozenLakeEnv.frame_to_rgb(obs))
    obs = env.step(answer("Left"))[0]
    assert np.array_equal(env.render(), FrozenLakeEnv.frame_to_rgb(obs))
    assert not np.array_equal(env.render(), image)


def test_show_neighbours_names_the_cell_each_move_leads_to():
    env = FrozenLakeEnv(show_neighbours=True, render_mode="rgb_array")
    obs, _ = env.reset(seed=0, options={"desc": DESC})
    # start (0, 0): the edge to the left and above, ice below and to the right
    assert obs == "P__O\n_O__\n___O\nO__G\nLeft # Down _ Right _ Up #"
    obs = env.step(answer("Right"))[0]  # (0, 1): a hole below
    assert obs == "_P_O\n_O__\n___O\nO__G\nLeft _ Down O Right _ Up #"
    env.step(answer("Right"))
    env.step(answer("Down"))
    env.step(answer("Down"))  # (2, 2): a hole to the right, ice above and below
    obs = env.step(answer("Down"))[0]  # (3, 2): the goal to the right, a hole nowhere near
    assert obs.split("\n")[-1] == "Left _ Down # Right G Up _"
    # the image is the grid's alone, as without the line
    plain = FrozenLakeEnv()
    plain.reset(seed=0, options={"desc": DESC})
    for move in ("Right", "Right", "Down", "Down", "Down"):
        plain_obs = plain.step(answer(move))[0]
    assert np.array_equal(env.render(), FrozenLakeEnv.frame_to_rgb(plain_obs))
    # the same map and seed give the same grid with or without the line
    assert obs.rsplit("\n", 1)[0] == plain_obs
