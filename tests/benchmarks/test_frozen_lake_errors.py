"""benchmarks/learning/frozen_lake_errors.py's map split: which maps need a move away from the goal, and
greedy play from the start, on hand-drawn maps."""

from __future__ import annotations

from pathlib import Path

from benchmarks.learning import frozen_lake_errors as fe
from envs.frozen_lake.maps import goal_distances

REPO = Path(__file__).resolve().parents[2]

LEFT, DOWN, RIGHT, UP = range(4)
# S two columns left of G with a hole between: Manhattan 2, shortest path 4 (down, right, right, up).
DETOUR = ["SHGF", "FFFF", "FFFF", "FFFF"]
# G two rows below S: Manhattan 2 and a straight path.
DIRECT = ["SFFF", "FHFF", "GFFF", "FFFF"]


def test_a_map_needs_a_detour_when_its_shortest_path_is_longer_than_the_manhattan_distance():
    assert goal_distances(DETOUR)[(0, 0)] == 4 and fe.needs_detour(DETOUR, goal_distances(DETOUR))
    assert goal_distances(DIRECT)[(0, 0)] == 2 and not fe.needs_detour(DIRECT, goal_distances(DIRECT))


def test_greedy_play_reaches_the_goal_stops_in_a_hole_and_runs_out_of_moves():
    around = {(0, 0): DOWN, (1, 0): RIGHT, (1, 1): RIGHT, (1, 2): UP}
    assert fe.plays_to_goal(DETOUR, around)
    assert not fe.plays_to_goal(DETOUR, {(0, 0): RIGHT})  # into the hole
    assert not fe.plays_to_goal(DETOUR, {(0, 0): DOWN, (1, 0): UP})  # a loop: 8 moves, no goal
    assert not fe.plays_to_goal(DIRECT, {(0, 0): DOWN, (1, 0): -1})  # an invalid answer ends it
    assert fe.plays_to_goal(DIRECT, {(0, 0): DOWN, (1, 0): DOWN})
