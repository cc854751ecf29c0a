"""Scripted policies drive the env managers: exact token ids, masks, log-probs and rewards."""

import asyncio
from collections import deque

import pytest

import envs  # noqa: F401  (registers the built-in envs)
from envs.frozen_lake.env import FrozenLakeEnv
from envs.frozen_lake.maps import MOVES, find_cell
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.chat_template import chat_template_ids
from roll.models.tiny import build_tiny_tokenizer

SEED = 123


def solve(desc):
    """Shortest list of action words from S to G (BFS), avoiding holes."""
    start, goal = find_cell(desc, "S"), find_cell(desc, "G")
    parent, queue = {start: None}, deque([start])
    while queue:
        cell = queue.popleft()
        for i, (dr, dc) in enumerate(MOVES):
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt in parent or not (0 <= nxt[0] < len(desc) and 0 <= nxt[1] < len(desc[0])):
                continue
            if desc[nxt[0]][nxt[1]] == "H":
                continue
            parent[nxt] = (cell, FrozenLakeEnv.actions[i])
            queue.append(nxt)
    path, cell = [], goal
    while parent[cell] is not None:
        cell, action = parent[cell]
        path.append(action)
    return path[::-1]


class ScriptedEngine:
    """Answers turn k with the k-th scripted word; records every prompt it was given."""

    def __init__(self, tokenizer, words):
        self.tokenizer, self.words, self.prompts = tokenizer, list(words), []

    async def __call__(self, request):
        self.prompts.append(list(request.prompt_ids))
        word = self.words[len(self.prompts) - 1]
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        return GenerateOutput(request.request_id, ids, [-0.5] * len(ids), "length", policy_version=7)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(corpus=[FrozenLakeEnv.instruction])


def make_manager(tokenizer, engine, max_steps=8):
    spec = EnvSpec(
        tag="FrozenLake",
        env_type="frozen_lake",
        env_config={"max_path_length": 8},
        max_steps=max_steps,
        max_tokens_per_step=1,
        response_prefix="<answer>",
    )
    return TrajEnvManager(spec, tokenizer, engine, SamplingParams(), sequence_length=4096)


def test_scripted_episode_token_ids_masks_and_rewards(tokenizer):
    env = FrozenLakeEnv(max_path_length=8)
    first_obs, info = env.reset(seed=SEED)
    path = solve(env._desc)
    words = ["G"] + path  # one invalid answer first, then the shortest path
    engine = ScriptedEngine(tokenizer, words)
    manager = make_manager(tokenizer, engine)
    traj = asyncio.run(manager.run_episode(EpisodeSpec("g0", "g0-0", env_seed=SEED, sample_seed=1)))

    # The oracle: the chat template applied once to the whole conversation as text.
    messages = [{"role": "system", "content": info["env_instruction"]}, {"role": "user", "content": first_obs}]
    replay = FrozenLakeEnv(max_path_length=8)
    replay.reset(seed=SEED)
    for k, word in enumerate(words):
        messages.append({"role": "assistant", "content": "<answer>" + word})
        obs, *_ = replay.step("<answer>" + word)
        if k + 1 < len(words):
            messages.append({"role": "user", "content": obs})
    full = chat_template_ids(tokenizer, messages, add_generation_prompt=False)
    close = chat_template_ids(tokenizer, messages[:2] + [{"role": "assistant", "content": ""}], False)[-2:]
    assert traj.token_ids == full[: len(full) - len(close)]  # ends right after the last answer

    word_ids = [tokenizer.convert_tokens_to_ids(w) for w in words]
    generated = [i for i, m in enumerate(traj.response_mask) if m]
    assert [traj.token_ids[i] for i in generated] == word_ids
    assert traj.turn_end_positions == generated
    assert [traj.infer_logprobs[i] for i in generated] == [-0.5] * len(words)
    assert sum(traj.infer_logprobs) == pytest.approx(-0.5 * len(words))
    assert traj.step_rewards == [-0.1] + [0.0] * (len(path) - 1) + [1.0]
    assert traj.success and traj.stop_reason == "terminated"
    assert (traj.num_actions, traj.num_valid_actions) == (len(words), len(path))
    assert traj.policy_version == 7
    # every prompt the engine saw is exactly the trajectory prefix before that turn's answer
    for k, prompt in enumerate(engine.prompts):
        assert prompt == traj.token_ids[: generated[k]]


# Qwen3's rule for assistant turns, in short: a turn after the last user message is rendered with a
# `<think>` block (empty if it had none), earlier turns without one. The history is therefore not
# append-only: the last turn changes once a user message follows it.
QWEN3_LIKE_TEMPLATE = (
    "{% set ns = namespace(last_query=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last_query %}"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n{{ m['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_rewrites_the_last_assistant_turn_keeps_the_generated_ids():
    """With a Qwen3-like template, every turn appends exactly `<|im_end|>`, the observation as a user
    turn and the generation prompt: no `<think>` block is spliced in after a generated answer."""
    tok = build_tiny_tokenizer(corpus=[FrozenLakeEnv.instruction], extra_tokens=["<think>", "</think>"])
    tok.chat_template = QWEN3_LIKE_TEMPLATE
    env = FrozenLakeEnv(max_path_length=8)
    first_obs, info = env.reset(seed=SEED)
    words = solve(env._desc)
    engine = ScriptedEngine(tok, words)
    traj = asyncio.run(make_manager(tok, engine).run_episode(EpisodeSpec("g", "g-0", env_seed=SEED, sample_seed=1)))

    text = f"<|im_start|>system\n{info['env_instruction']}<|im_end|>\n<|im_start|>user\n{first_obs}<|im_end|>\n"
    replay = FrozenLakeEnv(max_path_length=8)
    replay.reset(seed=SEED)
    for k, word in enumerate(words):
        text += "<|im_start|>assistant\n<answer>" + word
        obs, *_ = replay.step("<answer>" + word)
        if k + 1 < len(words):
            text += f"<|im_end|>\n<|im_start|>user\n{obs}<|im_end|>\n"
    assert traj.token_ids == tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert tok.convert_tokens_to_ids("<think>") not in traj.token_ids
    assert traj.success
    for k, prompt in enumerate(engine.prompts):
        assert prompt == traj.token_ids[: [i for i, m in enumerate(traj.response_mask) if m][k]]


def test_episode_stops_after_max_steps_without_trailing_observation(tokenizer):
    engine = ScriptedEngine(tokenizer, ["Left", "Right", "Left"])
    env = FrozenLakeEnv(max_path_length=8)
    env.reset(seed=SEED)
    manager = make_manager(tokenizer, engine, max_steps=3)
    traj = asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", env_seed=SEED, sample_seed=1)))
    if traj.stop_reason == "terminated":  # the map put a hole next to the start: still consistent
        assert traj.num_actions <= 3
    else:
        assert traj.stop_reason == "max_steps" and traj.num_actions == 3
        assert traj.response_mask[-1] == 1  # nothing appended after the last answer
    assert len(traj.token_ids) == len(traj.response_mask) == len(traj.infer_logprobs)


def test_an_episode_with_a_temperature_samples_at_it_and_the_next_one_as_the_manager(tokenizer):
    class Recording(ScriptedEngine):
        async def __call__(self, request):
            self.sampling = getattr(self, "sampling", []) + [request.params]
            return await super().__call__(request)

    engine = Recording(tokenizer, ["Left"] * 4)
    manager = make_manager(tokenizer, engine, max_steps=2)
    hot = asyncio.run(manager.run_episode(EpisodeSpec("g", "g-r1-0", env_seed=SEED, sample_seed=1, temperature=1.7)))
    asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", env_seed=SEED, sample_seed=2)))
    temperatures = [s.temperature for s in engine.sampling]
    assert temperatures == [1.7] * hot.num_actions + [1.0] * (len(temperatures) - hot.num_actions)
    assert {s.max_new_tokens for s in engine.sampling} == {1}  # the rest of the sampling as the manager's


def test_step_manager_one_sample_per_step(tokenizer):
    from roll.agentic.env_manager.step_env_manager import StepEnvManager, state_hash

    env = FrozenLakeEnv(max_path_length=8)
    obs0, info = env.reset(seed=SEED)
    path = solve(env._desc)
    words = ["G"] + path
    engine = ScriptedEngine(tokenizer, words)
    spec = EnvSpec(
        tag="FrozenLake",
        env_type="frozen_lake",
        env_config={"max_path_length": 8},
        max_steps=8,
        max_tokens_per_step=1,
        response_prefix="<answer>",
    )
    manager = StepEnvManager(spec, tokenizer, engine, SamplingParams(), sequence_length=4096)
    traj = asyncio.run(manager.run_episode(EpisodeSpec("g0", "g0-0", env_seed=SEED, sample_seed=1)))

    assert traj.token_ids == [] and len(traj.steps) == len(words)
    replay = FrozenLakeEnv(max_path_length=8)
    obs, _ = replay.reset(seed=SEED)
    prefix = tokenizer.encode("<answer>", add_special_tokens=False)
    for k, (word, step) in enumerate(zip(words, traj.steps)):
        messages = [{"role": "system", "content": info["env_instruction"]}, {"role": "user", "content": obs}]
        assert step.prompt_ids == chat_template_ids(tokenizer, messages, add_generation_prompt=True) + prefix
        assert step.prompt_ids == engine.prompts[k]
        assert step.response_ids == [tokenizer.convert_tokens_to_ids(word)]
        assert step.state_hash == state_hash(obs) and step.step == k
        obs, reward, *_ = replay.step("<answer>" + word)
        assert step.reward == reward
    # the invalid first answer leaves the state unchanged: steps 0 and 1 share an anchor state
    assert traj.steps[0].state_hash == traj.steps[1].state_hash
    assert traj.success and traj.step_rewards[-1] == 1.0


def test_a_response_is_decoded_once_however_often_a_turn_reads_it(tokenizer, monkeypatch):
    from roll.agentic.env_manager import chat as chat_module

    monkeypatch.setattr(chat_module, "_MEMO", {})  # the process's memo, which other tests filled
    monkeypatch.setattr(chat_module, "_OWNERS", {})
    chat = chat_module.ChatFormatter(tokenizer, response_prefix="<answer>")
    ids = tokenizer.encode("Left", add_special_tokens=False)
    decoded = []
    real = tokenizer.decode
    monkeypatch.setattr(tokenizer, "decode", lambda *a, **k: decoded.append(a[0]) or real(*a, **k))
    texts = [chat.response_text(ids) for _ in range(3)]
    assert texts == ["<answer>Left"] * 3 and decoded == [ids]
    assert chat_module.ChatFormatter(tokenizer).response_text(ids) == "Left"  # the prefix is part of the key


def test_the_memo_keeps_its_tokenizers_alive_so_that_no_new_one_takes_their_ids(monkeypatch):
    import gc
    import weakref

    from roll.agentic.env_manager import chat as chat_module

    monkeypatch.setattr(chat_module, "_MEMO", {})
    monkeypatch.setattr(chat_module, "_OWNERS", {})
    old = build_tiny_tokenizer(corpus=[FrozenLakeEnv.instruction])
    chat_module.ChatFormatter(old).response_text([10])
    alive = weakref.ref(old)
    del old
    gc.collect()
    assert alive() is not None  # its id stays taken while the memo holds its entries
    chat_module._MEMO.update({(i, "x"): i for i in range(chat_module._MEMO_SIZE)})  # full: the next entry empties it
    chat_module.ChatFormatter(build_tiny_tokenizer(corpus=["Left"])).response_text([10])
    gc.collect()
    assert alive() is None and len(chat_module._OWNERS) == 1
