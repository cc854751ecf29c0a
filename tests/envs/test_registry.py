"""Env registry: every way to name an env, clear errors, entry-point plugins, check_env on all."""

import sys
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  registers the built-ins (the entry point may not be installed)
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.env import registry
from roll.agentic.env.registry import (
    check_env_config,
    list_envs,
    load_plugins,
    make_env,
    register_env,
    resolve_env_class,
)


def test_builtins_listed():
    assert "roll/FrozenLake-v0" in list_envs()


@pytest.mark.parametrize("env_id", list_envs())
def test_check_env_every_registered_env(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium's checker reports problems as warnings
        check_env(gym.make(env_id).unwrapped)


@pytest.mark.parametrize("env_type", ["roll/FrozenLake-v0", "frozen_lake", "envs.frozen_lake.env:FrozenLakeEnv"])
def test_resolve_every_form(env_type):
    assert resolve_env_class(env_type) is FrozenLakeEnv


@pytest.mark.parametrize(
    ("env_type", "why"),
    [
        ("xyz", "unknown env_type 'xyz'; known: "),
        ("no_such_module_xyz:Env", "no module 'no_such_module_xyz'"),
        ("envs.frozen_lake.env:NoSuchEnv", "has no 'NoSuchEnv'"),
        ("CartPole-v1", "not a TextEnv"),
        ("gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv", "not a TextEnv"),
    ],
)
def test_resolve_errors_are_one_clear_line(env_type, why):
    with pytest.raises(ValueError) as error:
        resolve_env_class(env_type)
    message = str(error.value)
    assert why in message and "\n" not in message


def test_unknown_lists_known_names():
    with pytest.raises(ValueError, match=r"known: .*frozen_lake.*roll/FrozenLake-v0"):
        resolve_env_class("frozenlake")


def test_make_env_builds_the_raw_env():
    env = make_env("frozen_lake", {"size": 6, "is_slippery": True})
    assert type(env) is FrozenLakeEnv and (env.size, env.is_slippery) == (6, True)


def test_make_env_unknown_key_names_it():
    with pytest.raises(TypeError, match=r"unknown env_config key\(s\) 'sise' for env_type"):
        make_env("frozen_lake", {"sise": 4, "hole_prob": 0.1})
    with pytest.raises(TypeError, match=r"key\(s\) 'a', 'b' for .*accepted: size, hole_prob"):
        check_env_config("frozen_lake", {"b": 1, "a": 2, "size": 3})
    assert check_env_config("frozen_lake", {"size": 3}) is FrozenLakeEnv


def test_register_again_is_a_no_op_and_alias_clash_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium warns when an id is overridden
        register_env("roll/FrozenLake-v0", "envs.frozen_lake.env:FrozenLakeEnv", ("frozen_lake",))
    with pytest.raises(ValueError, match="'frozen_lake' already names 'roll/FrozenLake-v0'"):
        register_env("roll/Other-v0", "envs.frozen_lake.env:FrozenLakeEnv", ("frozen_lake",))
    assert "roll/Other-v0" not in gym.registry


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """An installed distribution (on sys.path) whose `roll.envs` entry point names `module`."""

    modules = []

    def install(module: str, source: str):
        modules.append(module)
        (tmp_path / module).mkdir()
        (tmp_path / module / "__init__.py").write_text(source)
        info = tmp_path / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[roll.envs]\nplugin = {module}\n")
        monkeypatch.syspath_prepend(str(tmp_path))

    monkeypatch.setattr(registry, "_ENTRY_POINTS", dict(registry._ENTRY_POINTS))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))
    load_plugins.cache_clear()
    yield install
    load_plugins.cache_clear()
    gym.registry.pop("rolltest/PluginLake-v0", None)
    for module in modules:
        sys.modules.pop(module, None)


def test_entry_point_plugin_registers_its_envs(plugin_dir):
    plugin_dir(
        "roll_plugin_ok",
        "from envs.frozen_lake.env import FrozenLakeEnv\n"
        "from roll.agentic.env import register_env\n"
        "class PluginLake(FrozenLakeEnv):\n    pass\n"
        "register_env('rolltest/PluginLake-v0', 'roll_plugin_ok:PluginLake', ('plugin_lake',))\n",
    )
    cls = resolve_env_class("plugin_lake")
    assert cls.__name__ == "PluginLake" and cls.__module__ == "roll_plugin_ok"
    assert "rolltest/PluginLake-v0" in list_envs()
    assert "plugin" in load_plugins()


def test_broken_plugin_is_named(plugin_dir):
    plugin_dir("roll_plugin_broken", "raise ImportError('needs foo')\n")
    with pytest.raises(RuntimeError, match="'plugin = roll_plugin_broken' failed to load: needs"):
        resolve_env_class("frozen_lake")
