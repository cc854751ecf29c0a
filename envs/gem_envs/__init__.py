"""GEM envs (`game:`, `rg:`, ... ids of the gem-llm package) as roll TextEnvs; see env.py."""

from envs.gem_envs.env import GemEnv
from roll.configs.roll_compat.unsupported import GEM_PREFIXES  # GEM's id namespaces (dataset ones refused by name)

__all__ = ["GEM_PREFIXES", "GemEnv"]
