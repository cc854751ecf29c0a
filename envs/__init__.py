"""roll's built-in environments. Importing this package registers them (see roll.agentic.env).

roll finds it through the `roll.envs` entry point (`builtin = envs` in pyproject.toml), never by name.
"""

from envs.gem_envs import GEM_PREFIXES
from roll.agentic.env import register_env, register_env_namespace

register_env("roll/FrozenLake-v0", "envs.frozen_lake.env:FrozenLakeEnv", aliases=("frozen_lake",))
register_env("roll/WebShop-v0", "envs.webshop.env:WebShopEnv", aliases=("webshop",))
register_env("roll/Sokoban-v0", "envs.sokoban.env:SokobanEnv", aliases=("sokoban",))
register_env("roll/SokobanNative-v0", "envs.sokoban.native:SokobanNativeEnv", aliases=("sokoban_native_env",))
register_env("roll/CodeSandbox-v0", "envs.code_sandbox.env:CodeSandboxEnv", aliases=("code_sandbox",))
register_env_namespace(GEM_PREFIXES, "envs.gem_envs.env:GemEnv")  # GEM ids: gem.make(env_type, **env_config)
