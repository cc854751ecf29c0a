"""Fault injection: crashes, hangs and malformed output each drop one episode with a clear cause."""

import asyncio
import math
import threading

import pytest

import envs  # noqa: F401  (registers the built-in envs)
from roll.agentic.env.faults import (
    EPISODE_KEY_OPTION,
    FaultInjectingEnv,
    FaultInjection,
    InjectedEnvError,
)
from roll.agentic.env.registry import check_env_config, make_env
from roll.agentic.env_manager.base import EnvStepTimeout, MalformedEnvOutput
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.tiny import build_tiny_tokenizer


def test_make_env_wraps_only_when_asked():
    assert not isinstance(make_env("frozen_lake", {}), FaultInjectingEnv)
    env = make_env("frozen_lake", {"fault_injection": {"raise_p": 0.5}})
    assert isinstance(env, FaultInjectingEnv) and env.actions == ("Left", "Down", "Right", "Up")


@pytest.mark.parametrize(
    "block, message",
    [
        ({"raise_pp": 0.1}, "fault_injection.raise_pp: extra inputs are not permitted"),
        ({"raise_p": 0.6, "garbage_p": 0.6}, "fault_injection: raise_p + hang_p + garbage_p must be <= 1"),
        ({"hang_p": -0.1}, "fault_injection.hang_p: input should be greater than or equal to 0"),
    ],
)
def test_bad_fault_injection_block_is_one_line(block, message):
    with pytest.raises(ValueError) as err:
        check_env_config("frozen_lake", {"fault_injection": block})
    assert str(err.value) == message


def _outcomes(env, episode_seed, n=200, episode_key=None):
    env.reset(seed=episode_seed, options=None if episode_key is None else {EPISODE_KEY_OPTION: episode_key})
    kinds = []
    for _ in range(n):
        try:
            obs, reward, *_ = env.step("<answer>Left</answer>")
            kinds.append("garbage" if obs is None and math.isnan(reward) else "ok")
        except InjectedEnvError:
            kinds.append("raise")
    return kinds


def test_faults_follow_the_seeds_and_rates():
    faults = FaultInjection(raise_p=0.1, garbage_p=0.2, seed=5)
    a = _outcomes(FaultInjectingEnv(make_env("frozen_lake", {}), faults), episode_seed=1)
    b = _outcomes(FaultInjectingEnv(make_env("frozen_lake", {}), faults), episode_seed=1)
    c = _outcomes(FaultInjectingEnv(make_env("frozen_lake", {}), faults), episode_seed=2)
    assert a == b and a != c  # a function of (fault seed, episode seed) only
    assert 0.05 < a.count("raise") / 200 < 0.15 and 0.14 < a.count("garbage") / 200 < 0.26


def test_members_of_a_group_fail_independently_but_reproducibly():
    """An env manager passes each episode's sampling seed as the episode key: the members of a
    group share the reset seed (the same map) but not their faults; the key never reaches the env."""
    faults = FaultInjection(raise_p=0.1, garbage_p=0.2, seed=5)
    env = FaultInjectingEnv(make_env("frozen_lake", {}), faults)
    member0, member1 = (_outcomes(env, episode_seed=1, episode_key=k) for k in (101, 202))
    assert member0 != member1 and member0 == _outcomes(env, episode_seed=1, episode_key=101)
    assert _outcomes(env, episode_seed=1, episode_key=None) == _outcomes(
        FaultInjectingEnv(make_env("frozen_lake", {}), faults), episode_seed=1
    )


def test_a_hang_ends_when_the_env_is_closed():
    env = FaultInjectingEnv(make_env("frozen_lake", {}), FaultInjection(hang_p=1.0))
    env.reset(seed=0)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(InjectedEnvError, env.step, "x")))
    thread.start()
    env.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and "ended by close" in str(errors[0].value)


async def _answer_left(request):
    return GenerateOutput(
        request.request_id, [TOKENIZER.convert_tokens_to_ids("Left")], [-0.1], "length", policy_version=0
    )


TOKENIZER = build_tiny_tokenizer()


def _run(faults: dict, timeout_s: float = 60.0):
    spec = EnvSpec(
        tag="FL",
        env_type="frozen_lake",
        env_config={"fault_injection": faults},
        max_steps=4,
        max_tokens_per_step=1,
        response_prefix="<answer>",
    )
    manager = TrajEnvManager(spec, TOKENIZER, _answer_left, SamplingParams(), 4096, step_timeout_s=timeout_s)

    async def play():
        try:
            return await manager.run_episode(EpisodeSpec("g", "g-0", env_seed=3, sample_seed=0))
        finally:  # as an env worker does with a dropped manager; releases the hung thread, so
            manager.close()  # asyncio.run's executor shutdown does not wait on it

    return asyncio.run(play())


@pytest.mark.parametrize(
    "faults, error, message",
    [
        ({"raise_p": 1.0}, InjectedEnvError, "injected env crash"),
        (
            {"garbage_p": 1.0},
            MalformedEnvOutput,
            "observation is not a str; reward is not a finite number; "
            "terminated/truncated are not bools; info is not a dict",
        ),
        ({"hang_p": 1.0}, EnvStepTimeout, "env.step exceeded 0.2s"),
    ],
)
def test_env_manager_turns_each_fault_into_one_clear_error(faults, error, message):
    with pytest.raises(error) as err:
        _run(faults, timeout_s=0.2)
    assert message in str(err.value)


def test_no_faults_plays_normally():
    traj = _run({"raise_p": 0.0})
    assert traj.num_actions >= 1 and traj.num_valid_actions == traj.num_actions
