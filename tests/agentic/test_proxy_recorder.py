"""The proxy's pure parts with hand-derived values: rewards spread over turns, the canonical form
that recognises an echoed answer, the template view of OpenAI messages."""

import pytest

from roll.agentic.proxy.chat import canonical, chain, template_messages
from roll.agentic.proxy.protocol import Message
from roll.agentic.proxy.recorder import spread_rewards


@pytest.mark.parametrize(
    ("score", "step_scores", "turns", "expected"),
    [
        (1.0, [], 3, [0.0, 0.0, 1.0]),  # no per-step scores: all on the last turn
        (0.7, [0.1, -0.1, 0.7], 3, [0.1, -0.1, 0.7]),  # one per turn, summing to the score
        (1.0, [0.1, 0.2, 0.3], 3, [0.1, 0.2, 0.7]),  # the rest of the score (0.4) on the last turn
        (0.5, [0.2, 0.3], 3, [0.0, 0.0, 0.5]),  # not one per turn: all on the last turn
        (0.0, [0.0], 0, []),
    ],
)
def test_spread_rewards(score, step_scores, turns, expected):
    assert spread_rewards(score, step_scores, turns) == pytest.approx(expected)
    assert sum(spread_rewards(score, step_scores, turns)) == pytest.approx(score if turns else 0.0)


def test_an_echoed_answer_is_the_answer_given():
    given = Message(
        role="assistant",
        content=None,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "act", "arguments": '{"action": "Left"}'}}],
    )
    echoed = Message.model_validate(
        {
            "role": "assistant",
            "content": "",
            "refusal": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "act", "arguments": '{"action":"Left"}'}}
            ],
        }
    )
    assert canonical(given) == canonical(echoed)
    other = Message(role="assistant", content="Left")
    assert canonical(other) != canonical(given)
    # a chain hash depends on the tools and on every earlier message
    user = Message(role="user", content="go")
    assert chain([user, given], None)[-1] == chain([user, echoed], None)[-1]
    assert chain([user, given], [{"type": "function"}])[-1] != chain([user, given], None)[-1]


def test_template_messages():
    messages = [
        Message(role="developer", content=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]),
        Message(
            role="assistant",
            content="Going.",
            tool_calls=[{"id": "c", "type": "function", "function": {"name": "act", "arguments": '{"action": "Up"}'}}],
        ),
        Message(role="tool", content="moved", tool_call_id="c", name="act"),
    ]
    assert template_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": 'Going.<tool_call>{"name": "act", "arguments": {"action": "Up"}}</tool_call>'},
        {"role": "tool", "content": "moved", "name": "act"},
    ]


def test_step_state_hash_is_the_last_messages():
    from roll.agentic.proxy.recorder import EpisodeRecorder
    from roll.models.tiny import build_tiny_tokenizer

    recorder = EpisodeRecorder(build_tiny_tokenizer(["a b c"]))
    one = recorder.prompt([Message(role="user", content="a"), Message(role="user", content="c")], None)
    two = recorder.prompt([Message(role="user", content="b"), Message(role="user", content="c")], None)
    three = recorder.prompt([Message(role="user", content="b")], None)
    assert one.state_hash == two.state_hash != three.state_hash
