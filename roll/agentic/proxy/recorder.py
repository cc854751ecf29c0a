"""Per-episode recording of the calls an agent made through the proxy, and the samples they become.

Every generated choice is a `Call`: the exact prompt ids the engine was given and its
`GenerateOutput` (ids, log-probs, policy version). Prompts are built so that a conversation which
extends an earlier answer extends that answer's ids (DESIGN "Generation"):

- the request's messages are hashed prefix by prefix (`chat.chain`); the longest prefix that ends
  with an assistant message the proxy produced names the `parent` call;
- the prompt is then the parent's prompt, its generated ids exactly, and the ids the template puts
  after an assistant turn for the messages that follow (`continuation_ids`): nothing generated is
  re-tokenised, so a template that renders history differently cannot change it;
- a request that extends no answer (the first one, or an agent that rewrote its history: a fork)
  is rendered afresh by the template, with the tools shown as `prompt_ids_with_tools` shows them.

Samples. Trajectory-wise: the longest chain of calls (ties: the latest), as one `TokenLedger`
sequence: mask 1 exactly on generated ids, the engine's log-probs there; other chains (n > 1
choices not taken, forks) are counted, not trained. Step-wise: every call is a `StepRecord`, its
state hash that of the last message before the answer. Rewards: the runner's `step_scores` go to
the turns in order when there is one per turn, the rest of `score` to the last turn.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from roll.agentic.agent_loop.base import continuation_ids
from roll.agentic.agent_loop.tool_agent import prompt_ids_with_tools
from roll.agentic.episode import TokenLedger
from roll.agentic.proxy.chat import canonical, chain, extend_chain, template_messages
from roll.agentic.proxy.protocol import Message
from roll.core.records import GenerateOutput, StepRecord


@dataclass
class Prompt:
    ids: list[int]
    parent: int | None  # the call whose prompt and answer these ids extend
    state_hash: str
    chain: list[str]  # prefix hashes of the request's messages
    shown: str = ""  # the text of the request's last message (what the agent last showed)


@dataclass
class Call:
    index: int
    prompt_ids: list[int]
    out: GenerateOutput
    parent: int | None
    state_hash: str
    shown: str = ""
    answer: str = ""  # the answer's text, tool calls as the policy wrote them


@dataclass
class EpisodeRecorder:
    """The calls of one episode (see the module docstring)."""

    tokenizer: object
    calls: list[Call] = field(default_factory=list)
    _answers: dict[str, int] = field(default_factory=dict)  # chain hash through an answer -> call
    forks: int = 0

    def prompt(self, messages: list[Message], tools: list[dict] | None) -> Prompt:
        hashes = chain(messages, tools)
        # GiGPO's anchor state: the last message (the observation), as StepEnvManager hashes it
        state = hashlib.blake2b(canonical(messages[-1]).encode(), digest_size=8).hexdigest()
        for end in range(len(messages) - 1, -1, -1):  # the longest prefix ending in our answer
            index = self._answers.get(hashes[end])
            tail = messages[end + 1 :]
            if index is None or any(m.role == "assistant" for m in tail):
                continue
            parent = self.calls[index]
            ids = parent.prompt_ids + parent.out.token_ids
            ids = ids + continuation_ids(self.tokenizer, template_messages(tail), parent.out)
            return Prompt(ids, index, state, hashes, messages[-1].text())
        if self.calls:
            self.forks += 1
        ids = prompt_ids_with_tools(self.tokenizer, template_messages(messages), tools or [])
        return Prompt(ids, None, state, hashes, messages[-1].text())

    def record(self, prompt: Prompt, out: GenerateOutput, answer: Message) -> Call:
        """A generated choice; `answer` is the assistant message returned for it."""
        text = template_messages([answer])[0]["content"]
        call = Call(len(self.calls), list(prompt.ids), out, prompt.parent, prompt.state_hash, prompt.shown, text)
        self.calls.append(call)
        self._answers[extend_chain(prompt.chain[-1], answer)] = call.index
        return call

    # ---- samples ----
    def main_chain(self) -> list[Call]:
        """The longest chain of calls (ties: the one ending latest), root first."""
        best: list[Call] = []
        for leaf in reversed(self.calls):
            path: list[Call] = []
            index: int | None = leaf.index
            while index is not None:
                path.append(self.calls[index])
                index = self.calls[index].parent
            if len(path) > len(best):
                best = path
        return best[::-1]

    def frames(self, calls: list[Call], rewards: list[float]) -> dict:
        """Frames for `render_save_dir`: what the agent showed before each answer, captioned with
        the answer and its reward (the env's own frames stay with the runner)."""
        return {
            "frames": [c.shown for c in calls],
            "frame_captions": [f"{c.answer!r} -> reward {r:g}" for c, r in zip(calls, rewards, strict=True)],
        }

    def trajectory_fields(self, rewards: list[float]) -> dict:
        """Trajectory-wise sample fields of the main chain; `rewards` one per turn of it."""
        calls = self.main_chain()
        ledger = TokenLedger(calls[0].prompt_ids)
        for k, call in enumerate(calls):
            if k:
                done = len(ledger.token_ids)
                if call.prompt_ids[:done] != ledger.token_ids:  # by construction; checked, never assumed
                    raise AssertionError(f"call {call.index}'s prompt does not extend its parent's ids")
                ledger.add_context(call.prompt_ids[done:])
            ledger.add_turn(call.out)
            ledger.step_rewards[-1] = rewards[k]
        return {**ledger.sample_fields(), "policy_versions": list(ledger.versions)}

    def step_fields(self, rewards: list[float]) -> dict:
        """Step-wise samples: every call; `rewards` one per call."""
        steps = [
            StepRecord(
                step=c.index,
                prompt_ids=list(c.prompt_ids),
                response_ids=list(c.out.token_ids),
                logprobs=list(c.out.logprobs),
                versions=list(c.out.token_versions),
                reward=rewards[c.index],
                state_hash=c.state_hash,
            )
            for c in self.calls
        ]
        return {"steps": steps, "policy_versions": [c.out.oldest_version for c in self.calls]}


def spread_rewards(score: float, step_scores: list[float], turns: int) -> list[float]:
    """One reward per turn summing to `score`: the runner's `step_scores` when there is one per
    turn, and whatever of `score` they do not account for on the last turn."""
    if turns == 0:
        return []
    rewards = [float(s) for s in step_scores] if len(step_scores) == turns else [0.0] * turns
    rewards[-1] += float(score) - sum(rewards)
    return rewards
