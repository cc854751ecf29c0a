"""Sokoban as a text env: push every box onto a target in a room generated from the seed."""

from envs.sokoban.env import SokobanEnv
from envs.sokoban.generator import generate_room
from envs.sokoban.room import DEFAULT_SYMBOLS, Room
from envs.sokoban.solver import solve, solve_room

__all__ = ["DEFAULT_SYMBOLS", "Room", "SokobanEnv", "generate_room", "solve", "solve_room"]
