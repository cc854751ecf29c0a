"""FrozenLake as a text env: walk from the start to the goal without falling into a hole."""

from envs.frozen_lake.env import FrozenLakeEnv
from envs.frozen_lake.maps import generate_map, shortest_path_length

__all__ = ["FrozenLakeEnv", "generate_map", "shortest_path_length"]
