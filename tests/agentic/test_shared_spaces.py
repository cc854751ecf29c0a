"""Envs share their (read-only) gymnasium spaces: one `SharedText` per set of arguments."""

import copy
import pickle

import pytest

import envs  # noqa: F401  registers the built-ins
from roll.agentic.env import make_env
from roll.agentic.env.base import CHARSET, SharedText, text_space


def test_envs_of_one_config_share_one_space_object():
    a, b = make_env("frozen_lake", {"size": 4}), make_env("frozen_lake", {"size": 5})
    assert a.observation_space is b.observation_space
    assert a.action_space is b.action_space is a.observation_space
    assert isinstance(a.observation_space, SharedText)
    # sokoban with its default symbols needs no extra characters: the same space as FrozenLake
    assert make_env("sokoban", {}).observation_space is a.observation_space


def test_a_space_with_other_characters_is_another_shared_space():
    wide = text_space(charset=CHARSET + "☃")
    assert wide is text_space(charset=CHARSET + "☃") and wide is not text_space()
    assert "☃" in wide and "☃" not in text_space()


def test_the_shared_space_cannot_be_changed():
    space = make_env("frozen_lake", {}).observation_space
    with pytest.raises(AttributeError, match="read-only"):
        space.max_length = 3
    with pytest.raises(TypeError):
        space._char_index["☃"] = 0
    assert space.max_length == 8192 and "☃" not in space


def test_seeding_one_envs_space_changes_no_rollout():
    """The sampling generator is the one shared state, and envs never draw from it."""

    def rollout(env, reseed_space: bool):
        obs = [env.reset(seed=7)[0]]
        for word in ("Left", "Down", "Right", "Up", "Down"):
            if reseed_space:
                env.action_space.seed(123)
                env.action_space.sample()
            obs.append(env.step(f"<answer>{word}</answer>")[0])
        return obs

    a, b = make_env("frozen_lake", {"is_slippery": True}), make_env("frozen_lake", {"is_slippery": True})
    assert rollout(a, reseed_space=True) == rollout(b, reseed_space=False)


def test_copies_and_pickles_give_back_the_shared_space():
    space = text_space()
    assert copy.copy(space) is space and copy.deepcopy(space) is space
    assert pickle.loads(pickle.dumps(space)) is space
    env = make_env("frozen_lake", {})
    assert copy.deepcopy(env).observation_space is space
