"""Sokoban: exact pushes and rewards, the BFS solver, solvable seeded rooms, the scripted agent."""

import warnings
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  registers the built-ins (the entry point may not be installed)
from envs.sokoban.env import PALETTE, SokobanEnv
from envs.sokoban.room import Room
from envs.sokoban.solver import live_cells, solve
from roll.agentic.env.registry import make_env

# One box one push from its target.
ONE_PUSH = ["######", "#PXO_#", "######"]
# Two boxes: Right pushes the top one onto its target, Right again pushes it off.
TWO_BOXES = ["#######", "#PXO__#", "#__XO_#", "#######"]
# Optimal: Right (push), Up, Right (walk round), Down (push onto the target).
AROUND = ["######", "#____#", "#PX__#", "#__O_#", "######"]


def answer(move: str) -> str:
    return f"<answer>{move}</answer>"


def play(env: SokobanEnv, room: list[str], moves: list[str]) -> list[tuple]:
    env.reset(seed=0, options={"room": room})
    return [env.step(answer(move))[:4] for move in moves]


def solved_by_script(env: SokobanEnv) -> int:
    """Play `scripted_action` until it gives up; the number of moves played."""
    moves = 0
    while (text := env.scripted_action()) is not None:
        env.step(text)
        moves += 1
    return moves


# --- solver ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rows", "plan"),
    [
        (ONE_PUSH, ["Right"]),
        (TWO_BOXES, ["Right", "Down", "Right"]),
        (AROUND, ["Right", "Up", "Right", "Down"]),
        (["#####", "#P√_#", "#####"], []),  # solved already
        (["#####", "#XPO#", "#####"], None),  # box in a corner
        (["######", "#PX__#", "#__O_#", "######"], None),  # a box on the top row stays there
    ],
)
def test_solve(rows, plan):
    assert solve(rows) == plan


def test_solver_gives_up_at_max_states():
    assert solve(AROUND, max_states=5) is None
    assert len(solve(AROUND, max_states=50)) == 4


def test_live_cells():
    # Pulling from the target O at (1, 3) reaches (1, 2) only: every other pull needs a wall cell.
    assert live_cells(Room.parse(ONE_PUSH)) == {(1, 2), (1, 3)}
    assert live_cells(Room.parse(AROUND)) == {(3, 3), (2, 3), (3, 2), (2, 2)}


# --- exact transitions and rewards ----------------------------------------------------------
def test_reset_renders_the_given_room():
    env = SokobanEnv()
    obs, info = env.reset(seed=0, options={"room": AROUND})
    assert obs == "\n".join(AROUND)
    assert info == {"env_instruction": SokobanEnv.instruction, "metrics": {}}
    assert "<answer>Up</answer>" in env.instruction and not env.success


def test_push_onto_then_off_a_target():
    steps = play(SokobanEnv(), TWO_BOXES, ["Right", "Right"])
    onto = "\n".join(["#######", "#_P√__#", "#__XO_#", "#######"])
    off = "\n".join(["#######", "#__SX_#", "#__XO_#", "#######"])  # the player stands on O
    assert steps == [(onto, 0.9, False, False), (off, -1.1, False, False)]


def test_solving_push_and_absorbing_end():
    env = SokobanEnv()
    env.reset(seed=0, options={"room": ONE_PUSH})
    obs, reward, terminated, truncated, info = env.step(answer("Right"))
    solved = "######\n#_P√_#\n######"
    assert (obs, reward, terminated, truncated) == (solved, 10.9, True, False)
    metrics = {"num_actions": 1.0, "num_invalid": 0.0, "boxes_on_target": 1.0}
    metrics |= {"num_boxes": 1.0, "min_moves": 1.0}
    assert info == {"action_is_valid": True, "success": True, "metrics": metrics}
    assert env.step(answer("Left"))[:4] == (solved, 0.0, True, False)


def test_walk_around_and_solve():
    steps = play(SokobanEnv(), AROUND, ["Right", "Up", "Right", "Down"])
    assert [s[1:] for s in steps] == [(-0.1, False, False)] * 3 + [(10.9, True, False)]
    assert steps[1][0] == "######\n#_P__#\n#__X_#\n#__O_#\n######"


def test_walking_onto_a_target_shows_s():
    env = SokobanEnv()
    env.reset(seed=0, options={"room": ["######", "#P_O_#", "#_X__#", "#____#", "######"]})
    env.step(answer("Right"))
    obs, reward, *_ = env.step(answer("Right"))
    assert (obs, reward) == ("######\n#__S_#\n#_X__#\n#____#\n######", -0.1)


@pytest.mark.parametrize(
    ("room", "move"),
    [
        (AROUND, "Left"),  # a wall
        (["#####", "#___#", "#_PX#", "#__O#", "#####"], "Right"),  # a box against a wall
        (["######", "#____#", "#PXX_#", "#_OO_#", "######"], "Right"),  # a box against a box
    ],
)
def test_blocked_move_changes_nothing(room, move):
    env = SokobanEnv()
    start, _ = env.reset(seed=0, options={"room": room})
    assert env.step(answer(move))[:4] == (start, -0.1, False, False)


def test_unparsable_action_gets_the_format_penalty():
    env = SokobanEnv(format_penalty=-0.5)
    start, _ = env.reset(seed=0, options={"room": AROUND})
    obs, reward, terminated, truncated, info = env.step("Right")  # no answer tags
    assert (obs, reward, terminated, truncated) == (start, -0.5, False, False)
    assert info["action_is_valid"] is False


def test_truncation_counts_parsed_moves():
    env = SokobanEnv(max_steps=3)
    env.reset(seed=0, options={"room": AROUND})
    flags = [env.step(text)[2:4] for text in (answer("Left"), "nonsense", answer("Up"), answer("Up"))]
    assert flags == [(False, False), (False, False), (False, False), (False, True)]


def test_solving_on_the_last_allowed_move_is_not_truncated():
    steps = play(SokobanEnv(max_steps=4), AROUND, ["Right", "Up", "Right", "Down"])
    assert steps[-1][1:] == (10.9, True, False)


# --- generated rooms ------------------------------------------------------------------------
def check_generated(env: SokobanEnv, seeds: range) -> Counter:
    """Every room of `seeds` is walled in, unsolved and solved by BFS in exactly `min_moves`."""
    min_moves = Counter()
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        rows = obs.split("\n")
        assert len(rows) == env.dim_room[0] and {len(row) for row in rows} == {env.dim_room[1]}
        assert set(rows[0] + rows[-1] + "".join(r[0] + r[-1] for r in rows)) == {"#"}
        assert obs.count("X") >= 1 and obs.count("X") + obs.count("√") == env.num_boxes
        plan = solve(rows)
        assert plan is not None and len(plan) >= 1
        metrics = env.step("no move")[4]["metrics"]
        assert metrics["min_moves"] == len(plan) and metrics["num_boxes"] == env.num_boxes
        min_moves[len(plan)] += 1
    return min_moves


def test_default_rooms_are_solvable():
    min_moves = check_generated(SokobanEnv(), range(300))
    assert len(min_moves) >= 8  # a spread of difficulties, not one memorisable plan length


def test_two_box_rooms_are_solvable():
    check_generated(SokobanEnv(dim_room=[7, 7], num_boxes=2), range(40))


def test_search_depth_sets_the_difficulty():
    def mean_min_moves(search_depth):
        env = SokobanEnv(search_depth=search_depth)
        counts = check_generated(env, range(100))
        return sum(k * v for k, v in counts.items()) / 100

    assert mean_min_moves(3) < mean_min_moves(30)


def test_same_seed_same_room_and_rollout():
    def rollout():
        env = SokobanEnv()
        steps = [env.reset(seed=7)]
        steps += [env.step(answer(SokobanEnv.actions[i % 4])) for i in range(10)]
        return steps

    assert rollout() == rollout()
    env = SokobanEnv()
    rooms = {env.reset(seed=seed)[0] for seed in range(100)}
    assert len(rooms) == 100  # 100 seeds, 100 different rooms


def test_scripted_action_solves_in_min_moves():
    env = SokobanEnv()
    for seed in range(100):
        env.reset(seed=seed)
        state = env.np_random.bit_generator.state
        assert solved_by_script(env) == env.episode_metrics()["min_moves"]
        assert env.success and env.scripted_action() is None
        assert env.np_random.bit_generator.state == state  # no randomness used


def test_scripted_action_replans_and_gives_up_on_a_dead_room():
    env = SokobanEnv()
    env.reset(seed=0, options={"room": AROUND})
    assert env.scripted_action() == answer("Right")
    env.step(answer("Up"))  # off the plan: the player now needs Down, Right, Up, Right, Down
    assert solved_by_script(env) == 5 and env.success
    env.reset(seed=0, options={"room": AROUND})
    env.step(answer("Right"))
    env.step(answer("Right"))  # the box is against the right wall, out of reach of its target
    assert env.scripted_action() is None and not env.success


# --- symbols, images, gymnasium -------------------------------------------------------------
def test_grid_vocab_changes_render_and_instruction():
    vocab = {"wall": "W", "empty": ".", "box": "B", "player": "A"}
    custom = SokobanEnv(grid_vocab=vocab)
    assert "Push every box B onto a target O" in custom.instruction
    table = str.maketrans({"#": "W", "_": ".", "X": "B", "P": "A"})
    for seed in range(5):
        assert custom.reset(seed=seed)[0] == SokobanEnv().reset(seed=seed)[0].translate(table)
    custom.reset(options={"room": ["WWWWWW", "WABO.W", "WWWWWW"]})
    assert custom.step(answer("Right"))[:3] == ("WWWWWW\nW.A√.W\nWWWWWW", 10.9, True)


def test_frame_to_rgb():
    image = SokobanEnv.frame_to_rgb("#P\nXZ")
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    assert tuple(image[3, 3]) == PALETTE["#"] and tuple(image[3, 35]) == PALETTE["P"]
    assert tuple(image[35, 3]) == PALETTE["X"] and tuple(image[35, 35]) == (128, 128, 128)
    env = SokobanEnv(render_mode="rgb_array")
    obs, _ = env.reset(seed=1)
    assert np.array_equal(env.render(), SokobanEnv.frame_to_rgb(obs))


@pytest.mark.parametrize(
    "config",
    [{}, {"dim_room": [7, 7], "num_boxes": 2, "grid_vocab": {"wall": "■", "box": "▣"}}],
)
def test_check_env(config):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make("roll/Sokoban-v0", **config).unwrapped)


def test_made_by_alias():
    env = make_env("sokoban", {"dim_room": [7, 5], "num_boxes": 2, "search_depth": 12})
    assert type(env) is SokobanEnv and env.dim_room == (7, 5) and env.num_boxes == 2


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"dim_room": 6}, "dim_room"),
        ({"dim_room": (6, 6, 6)}, "dim_room"),
        ({"dim_room": (6.0, 6)}, "dim_room"),
        ({"dim_room": (4, 4)}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"num_boxes": 15}, "num_boxes"),  # 16 inner cells: a box too many for the player
        ({"search_depth": 0}, "search_depth"),
        ({"max_steps": 0}, "max_steps"),
        ({"grid_vocab": {"lava": "L"}}, "unknown names"),
        ({"grid_vocab": {"wall": "##"}}, "one non-space character"),
        ({"grid_vocab": {"wall": "\n"}}, "one non-space character"),
        ({"grid_vocab": {"wall": "_"}}, "distinct"),
        ({"render_mode": "human"}, "render_mode"),
    ],
)
def test_bad_params(config, why):
    with pytest.raises(ValueError, match=why) as error:
        SokobanEnv(**config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("room", "why"),
    [
        (["#####", "#PXO#", "####"], "equal length"),
        (["#####", "#PXOZ", "#####"], "unknown symbol 'Z'"),
        (["######", "#PXOP#", "######"], "exactly one player"),
        (["######", "#PXXO#", "######"], "as many targets as boxes"),
        (["#####", "#P_O#", "#####"], "as many targets as boxes"),
        (["######", "#PX__#", "#__O_#", "######"], "no solution"),
    ],
)
def test_bad_rooms(room, why):
    with pytest.raises(ValueError, match=why):
        SokobanEnv().reset(options={"room": room})


def test_show_neighbours_names_two_cells_each_way():
    env = SokobanEnv(show_neighbours=True, render_mode="rgb_array")
    obs, _ = env.reset(seed=0, options={"room": AROUND})
    # player (2, 1): floor then the wall up and down, the wall left, the box then floor right
    assert obs == "######\n#____#\n#PX__#\n#__O_#\n######\nUp _ # Down _ # Left # # Right X _"
    obs = env.step(answer("Right"))[0]  # the push: box at (2, 3), player at (2, 2)
    assert obs.split("\n")[-1] == "Up _ # Down _ # Left _ # Right X _"
    plain = SokobanEnv()
    plain.reset(seed=0, options={"room": AROUND})
    plain_obs = plain.step(answer("Right"))[0]
    assert obs.rsplit("\n", 1)[0] == plain_obs
    assert np.array_equal(env.render(), SokobanEnv.frame_to_rgb(plain_obs))
    # off the grid reads as a wall: ONE_PUSH's player has the grid's edge two cells up
    env.reset(seed=0, options={"room": ONE_PUSH})
    assert env.step(answer("Left"))[0].split("\n")[-1] == "Up # # Down # # Left # # Right X O"
