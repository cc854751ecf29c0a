"""The chat proxy against the real inference worker (tiny model, hf engine) and the real `openai`
client over HTTP: the samples are made of the exact ids and log-probs the engine produced, and
bad requests are refused with the field named."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest

from roll.agentic.gateway import InferenceGateway
from roll.agentic.proxy.server import ProxyServer
from roll.core.records import GenerateOutput, SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.chat_template import chat_template_ids
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model

CORPUS = ["You push boxes.", "Move Left Right Up Down.", "The answer is 42 done moved"]
EXTRA = ["<tool_call>", "</tool_call>", '"name"', '"arguments"', '"move"', '"direction"', '"Left"']


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def on(loop, coro, timeout=120):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


class Recorded:
    """The gateway's generate, with every (request, output) pair the engine answered kept: what the
    proxy's samples are compared against."""

    def __init__(self, generate):
        self._generate, self.pairs = generate, []

    async def __call__(self, request):
        out = await self._generate(request)
        self.pairs.append((request, out))
        return out


@pytest.fixture(scope="module")
def served(loop, tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", corpus=CORPUS, extra_tokens=EXTRA, seed=5)
    tokenizer = load_tokenizer(path)
    engine = Recorded(InferenceGateway([InferenceWorker(path, num_threads=1)]).generate)
    server = ProxyServer(model_names=("roll-policy", path))
    base_url = on(loop, server.start())
    yield server, base_url, engine, tokenizer
    on(loop, server.stop())


def open_episode(loop, served, traj_id, generate=None, **kw):
    server, base_url, engine, tokenizer = served
    defaults = dict(
        sample_seed=11,
        tokenizer=tokenizer,
        generate=generate or engine,
        sampling=SamplingParams(max_new_tokens=12, temperature=1.0),
        sequence_length=1024,
    )

    async def make():
        return server.open_episode(traj_id, **{**defaults, **kw})

    episode = on(loop, make())
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=episode.token, max_retries=0)
    return episode, client


def test_samples_are_the_engines_ids_and_logprobs_over_three_turns(loop, served):
    engine, tokenizer = served[2], served[3]
    engine.pairs.clear()
    episode, client = open_episode(loop, served, "ep-exact")
    messages = [{"role": "system", "content": "You push boxes."}, {"role": "user", "content": "Move Left"}]
    answers = []
    for turn in range(3):
        resp = client.chat.completions.create(model="roll-policy", messages=messages, logprobs=True, temperature=1.0)
        choice = resp.choices[0]
        answers.append(choice)
        messages += [choice.message.model_dump(exclude_none=True), {"role": "user", "content": f"Turn {turn} Right"}]
        assert resp.system_fingerprint == "roll-policy-v0"
    served[0].close_episode(episode)
    pairs = engine.pairs
    assert len(pairs) == 3
    # the first prompt is the template's rendering; every later prompt extends the previous prompt
    # and the ids the engine generated for it, unchanged (no re-tokenisation)
    assert pairs[0][0].prompt_ids == chat_template_ids(tokenizer, messages[:2], True)
    for (req, out), (nxt, _) in zip(pairs, pairs[1:], strict=False):
        assert nxt.prompt_ids[: len(req.prompt_ids) + len(out.token_ids)] == req.prompt_ids + out.token_ids
    # the API's log-probs are the engine's
    for choice, (_, out) in zip(answers, pairs, strict=True):
        assert [c.logprob for c in choice.logprobs.content] == pytest.approx(out.logprobs, abs=0)
    fields = episode.recorder.trajectory_fields([0.0, 0.0, 1.0])
    last_req, last_out = pairs[-1]
    assert fields["token_ids"] == last_req.prompt_ids + last_out.token_ids
    generated = [i for i, m in enumerate(fields["response_mask"]) if m]
    assert [fields["token_ids"][i] for i in generated] == sum((o.token_ids for _, o in pairs), [])
    assert [fields["infer_logprobs"][i] for i in generated] == sum((o.logprobs for _, o in pairs), [])
    assert sum(fields["response_mask"]) == sum(len(o.token_ids) for _, o in pairs)
    assert fields["turn_end_positions"][-1] == len(fields["token_ids"]) - 1


def test_n_choices_stream_and_stop_string(loop, served):
    engine, tokenizer = served[2], served[3]
    engine.pairs.clear()
    episode, client = open_episode(loop, served, "ep-n")
    resp = client.chat.completions.create(
        model="roll-policy", messages=[{"role": "user", "content": "Move"}], n=3, max_tokens=5, top_p=0.9
    )
    assert len(resp.choices) == 3 and len(engine.pairs) == 3
    assert all(len(o.token_ids) <= 5 and r.params.top_p == 0.9 for r, o in engine.pairs)
    assert len({r.seed for r, _ in engine.pairs}) == 3  # each choice its own sampling seed
    chunks = list(
        client.chat.completions.create(
            model="roll-policy", messages=[{"role": "user", "content": "Move"}], stream=True, stop=["Left"]
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    req, out = engine.pairs[-1]
    assert tokenizer.convert_tokens_to_ids("Left") in req.params.stop_token_ids
    assert text == tokenizer.decode(
        [i for i in out.token_ids if i != tokenizer.convert_tokens_to_ids("Left")], skip_special_tokens=True
    )
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    served[0].close_episode(episode)


class ScriptedToolEngine:
    """Answers with a fixed text (a tool call, then a final answer): the engine's ids of it with
    log-prob -0.25 each; for checking the tool-call formatting, which a random model never hits."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.requests = tokenizer, list(texts), []

    async def __call__(self, request):
        self.requests.append(request)
        text = self.texts[len(self.requests) - 1]
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return GenerateOutput(request.request_id, ids, [-0.25] * len(ids), "stop", policy_version=4)


def test_tool_calls_round_trip_and_the_next_prompt_extends_the_generated_ids(loop, served):
    tokenizer = served[3]
    call = '<tool_call>{"name": "move", "arguments": {"direction": "Left"}}</tool_call>'
    scripted = ScriptedToolEngine(tokenizer, [call, "done"])
    episode, client = open_episode(loop, served, "ep-tools", generate=scripted)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "move",
                "description": "Move",
                "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
            },
        }
    ]
    messages = [{"role": "user", "content": "Move"}]
    first = client.chat.completions.create(model="roll-policy", messages=messages, tools=tools, tool_choice="auto")
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and first.system_fingerprint == "roll-policy-v4"
    assert message.tool_calls[0].function.name == "move"
    assert message.tool_calls[0].function.arguments == '{"direction": "Left"}'
    messages += [message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "moved"}]
    second = client.chat.completions.create(model="roll-policy", messages=messages, tools=tools)
    assert second.choices[0].message.content == "done" and second.choices[0].finish_reason == "stop"
    first_req, second_req = scripted.requests
    first_ids = tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert second_req.prompt_ids[: len(first_req.prompt_ids) + len(first_ids)] == first_req.prompt_ids + first_ids
    assert episode.recorder.forks == 0
    fields = episode.recorder.trajectory_fields([0.0, 1.0])
    assert fields["policy_versions"] == [4, 4] and sum(fields["response_mask"]) == len(first_ids) + 2
    served[0].close_episode(episode)


def test_a_rewritten_history_is_a_fork_rendered_afresh_and_the_longest_chain_is_trained(loop, served):
    engine = served[2]
    episode, client = open_episode(loop, served, "ep-fork")
    messages = [{"role": "user", "content": "Move"}]
    a = client.chat.completions.create(model="roll-policy", messages=messages).choices[0].message
    messages += [a.model_dump(exclude_none=True), {"role": "user", "content": "Left"}]
    client.chat.completions.create(model="roll-policy", messages=messages)
    edited = [
        {"role": "user", "content": "Move"},
        {"role": "assistant", "content": "Up"},
        {"role": "user", "content": "x"},
    ]
    client.chat.completions.create(model="roll-policy", messages=edited)
    calls = episode.recorder.calls
    assert [c.parent for c in calls] == [None, 0, None] and episode.recorder.forks == 1
    assert [c.index for c in episode.recorder.main_chain()] == [0, 1]
    steps = episode.recorder.step_fields([0.0, 0.0, 1.0])["steps"]
    assert [s.response_ids for s in steps] == [c.out.token_ids for c in calls]
    served[0].close_episode(episode)
    assert engine.pairs


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}', 400, "model: 'gpt-9' is not served"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], '
            b'"tools": [{"type": "function", "function": {"name": "a b"}}]}',
            400,
            "tools.0.function.name",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 5}}',
            400,
            "logit_bias: is not a field",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop": ["two words"]}', 400, "stop: 'two words' is"),
        (b'{"messages": [{"role": "user", "content": "x"}]' + b" " * (1 << 16) + b"}", 413, "over the limit"),
    ],
)
def test_bad_requests_are_refused_with_the_field_named(loop, served, body, status, says):
    server, base_url = served[0], served[1]
    server.max_body_bytes = 1 << 15
    episode, _ = open_episode(loop, served, "ep-bad")
    resp = httpx.post(
        f"{base_url}/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {episode.token}", "Content-Type": "application/json"},
    )
    server.max_body_bytes = 8 << 20
    assert resp.status_code == status and says in resp.json()["error"]["message"], resp.text
    assert episode.recorder.calls == []
    server.close_episode(episode)


def test_requests_outside_a_live_episode_are_refused(loop, served):
    server, base_url = served[0], served[1]
    body = {"model": "roll-policy", "messages": [{"role": "user", "content": "x"}]}
    assert httpx.post(f"{base_url}/v1/chat/completions", json=body).status_code == 401
    anon = openai.OpenAI(base_url=f"{base_url}/v1", api_key="guessed", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="only inside a live episode"):
        anon.chat.completions.create(**body)
    episode, client = open_episode(loop, served, "ep-closed")
    server.close_episode(episode)
    with pytest.raises(openai.APIStatusError, match="is over") as err:
        client.chat.completions.create(**body)
    assert err.value.status_code == 410
    with pytest.raises(openai.BadRequestError, match="model"):
        episode2, client2 = open_episode(loop, served, "ep-model")
        client2.chat.completions.create(model="gpt-4o", messages=body["messages"])
