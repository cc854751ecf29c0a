"""Agent loops: a Python coroutine plays one episode against the policy and hands back the same
`Trajectory` an env manager would, so the batch builder and PPO/GRPO train it unchanged (the
"agent loop" of verl and ChatLearn: the rollout logic is user code, the training pipeline is not).

An agent is built with `(cfg, client, tokenizer)` and played with `await agent.run(**row)`, where
`row` is one dataset row: `prompt` (or `messages`), the ids the scheduler gives it (`tag`,
`traj_group_id`, `traj_id`, `env_seed`, `sample_seed`) and any other fields (an answer, a test
case), which reach the reward fn untouched. The `client` is anything with
`async generate(GenerateRequest) -> GenerateOutput`: an `InferenceGateway` in front of the
inference workers, or a scripted model in tests.

Token bookkeeping follows the env managers (DESIGN "Generation"): the first prompt is rendered
by the chat template once; after that, the ids the engine generated are kept exactly and every
message that comes back (a tool result, a user reply) is appended as the ids the template puts
after an assistant turn, derived from a fixed probe conversation (`continuation_ids`,
roll.models.chat_template). Past turns
are never re-rendered, so templates that rewrite history (Qwen3 drops `<think>` blocks of earlier
turns) cannot change the tokens PPO scores.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from omegaconf import DictConfig

from roll.agentic.agent_loop.registry import register, to_cfg
from roll.agentic.episode import EpisodeSpec, TokenLedger
from roll.agentic.gateway import InferenceGateway, is_ray_actor
from roll.core.enums import StopReason
from roll.core.imports import ObjectNotFound, import_object
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams, Trajectory
from roll.core.seeding import derive_seed
from roll.models.chat_template import continuation_ids as template_continuation_ids
from roll.models.chat_template import encode, render_text

RewardFn = Callable[[dict, str], float]


# ---- chat template helpers ----------------------------------------------------------------


def continuation_ids(tokenizer, messages: list[dict], generated: GenerateOutput) -> list[int]:
    """The ids to append after `generated` when `messages` (role "tool" or "user") come next
    (`roll.models.chat_template.continuation_ids`); if the model already emitted the closing token
    (finish "stop"), it is not appended twice."""
    tail = template_continuation_ids(tokenizer, messages)
    if generated.finish_reason == "stop" and generated.token_ids and tail[:1] == generated.token_ids[-1:]:
        tail = tail[1:]  # the model closed the turn itself
    return tail


def resolve_reward_fn(spec: RewardFn | str | None) -> RewardFn:
    """A reward fn from a callable or its import path "package.module:function"."""
    if spec is None:
        raise ValueError(
            "no reward_fn: name one in the agent config or the row "
            "(a callable reward(row, response_text) -> float, or 'package.module:function')"
        )
    if isinstance(spec, str):
        try:
            spec = import_object(spec)
        except ObjectNotFound as e:
            raise ValueError(f"reward_fn {spec!r} not found ({e})") from None
    if not callable(spec):
        raise TypeError(f"reward_fn {spec!r} is not callable")
    return spec


# ---- the agent base class -----------------------------------------------------------------


class AgentLoop:
    """Base of every agent. Subclasses implement `rollout(episode, row)`; `run(**row)` is the
    entry point the pipeline calls. `defaults` lists every config key the agent reads, with its
    default: a key not listed is a typo and rejected at construction."""

    agent_name: ClassVar[str] = "agent"
    defaults: ClassVar[dict[str, Any]] = {
        "reward_fn": None,  # callable reward(row, response_text) -> float, or "module:function"
        "success_reward": 1.0,  # an episode is a success when the answer's reward reaches this
        "system_prompt": None,  # system message for rows that give a `prompt`
        "max_tokens_per_turn": 256,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "do_sample": True,
    }

    def __init__(self, cfg: Mapping[str, Any] | DictConfig | None, client: Any, tokenizer: Any):
        given = to_cfg(cfg)
        unknown = sorted(set(given) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"unknown config key(s) {', '.join(map(repr, unknown))} for agent "
                f"{self.agent_name!r}; accepted: {', '.join(sorted(self.defaults))}"
            )
        self.cfg = to_cfg({**self.defaults, **dict(given)})
        if is_ray_actor(client):  # a bare inference worker handle: route through a gateway of one
            client = InferenceGateway([client])
        self.client = client
        self.tokenizer = tokenizer
        self._generate = client.generate if hasattr(client, "generate") else client

    async def run(self, /, **row: Any) -> Trajectory:
        """Play the episode of one dataset row; the engine may then drop its cached KV (when the
        client is a gateway: `release`)."""
        episode = self.episode(row)
        try:
            return await self.rollout(episode, row)
        finally:
            release = getattr(self.client, "release", None)
            if callable(release):
                release(episode.traj_id)

    async def rollout(self, episode: EpisodeSpec, row: dict[str, Any]) -> Trajectory:
        raise NotImplementedError

    # -- helpers for subclasses --
    def episode(self, row: Mapping[str, Any]) -> EpisodeSpec:
        """The row's ids; without a `traj_id` a fresh one (then pass `sample_seed` to reproduce)."""
        traj_id = str(row.get("traj_id") or f"{self.agent_name}-{uuid.uuid4().hex[:12]}")
        return EpisodeSpec(
            tag=str(row.get("tag", self.agent_name)),
            traj_group_id=str(row.get("traj_group_id", traj_id)),
            traj_id=traj_id,
            env_seed=int(row.get("env_seed", 0)),
            sample_seed=int(row.get("sample_seed", derive_seed(traj_id))),
        )

    def initial_messages(self, row: Mapping[str, Any]) -> list[dict]:
        if row.get("messages"):
            return [dict(m) for m in row["messages"]]
        if row.get("prompt") is None:
            raise ValueError(f"row for agent {self.agent_name!r} has neither 'prompt' nor 'messages'")
        messages = [{"role": "user", "content": str(row["prompt"])}]
        if self.cfg.system_prompt:
            messages.insert(0, {"role": "system", "content": str(self.cfg.system_prompt)})
        return messages

    async def generate(
        self, episode: EpisodeSpec, turn: int, prompt_ids: list[int], max_new_tokens: int
    ) -> GenerateOutput:
        """Turn `turn`'s generation: request `traj_id/turn`, session `traj_id` (the engine keeps
        the conversation's KV between turns), seed derived from the episode and the turn."""
        params = SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=float(self.cfg.temperature),
            top_p=float(self.cfg.top_p),
            top_k=int(self.cfg.top_k),
            do_sample=bool(self.cfg.do_sample),
        )
        request = GenerateRequest(
            f"{episode.traj_id}/{turn}",
            list(prompt_ids),
            params,
            derive_seed(episode.sample_seed, turn),
            session_id=episode.traj_id,
        )
        return await self._generate(request)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def reward(self, row: Mapping[str, Any], response_text: str) -> float:
        """The row's reward fn (else the config's) on the answer; it may be sync or async."""
        value = resolve_reward_fn(row.get("reward_fn") or self.cfg.reward_fn)(dict(row), response_text)
        if inspect.isawaitable(value):
            value = await value
        return float(value)

    def trajectory(
        self,
        episode: EpisodeSpec,
        ledger: TokenLedger,
        *,
        success: bool,
        stop_reason: StopReason,
        num_valid_actions: int,
        metrics: Mapping[str, float] | None = None,
    ) -> Trajectory:
        return Trajectory(
            tag=episode.tag,
            traj_group_id=episode.traj_group_id,
            traj_id=episode.traj_id,
            env_seed=episode.env_seed,
            step_rewards=list(ledger.step_rewards),
            success=success,
            stop_reason=stop_reason,
            policy_version=max(ledger.token_versions + [0]),  # -1 marks ids it did not generate
            num_actions=ledger.num_turns,
            num_valid_actions=num_valid_actions,
            metrics={k: float(v) for k, v in (metrics or {}).items()},
            policy_versions=list(ledger.versions),
            **ledger.sample_fields(),
        )


@register("single_turn")
class SingleTurnAgent(AgentLoop):
    """One prompt, one answer, one reward: the RLVR case (GSM8K-style), as an agent loop so that
    single- and multi-turn tasks share the rollout path."""

    async def rollout(self, episode: EpisodeSpec, row: dict[str, Any]) -> Trajectory:
        prompt = encode(self.tokenizer, render_text(self.tokenizer, self.initial_messages(row), True))
        ledger = TokenLedger(prompt)
        out = await self.generate(episode, 0, prompt, int(self.cfg.max_tokens_per_turn))
        ledger.add_turn(out)
        reward = await self.reward(row, self.decode(out.token_ids))
        ledger.step_rewards[-1] += reward
        stop_reason = StopReason.of_answer(out.finish_reason)
        return self.trajectory(
            episode, ledger, success=reward >= self.cfg.success_reward, stop_reason=stop_reason, num_valid_actions=1
        )
