"""Built-in runners: our registered envs played through the proxy with the `openai` client.

`GEMRunner` (ROLL's name): text in, text out. The first user message is the observation (ROLL's
`agent_template` filled as ROLL's GEMRunner fills it, when the tag has one); the system message is
`agent_system_template` followed by the env's instruction (ROLL's rule), or, without a template,
the tag's `instruction` rule (None: the env's own, "": none). Each answer's text is the action;
each following observation is the next user message. One chat call per env step, so
`step_scores` line up with the turns.

`ToolCallRunner` (ROLL's name): the same envs through OpenAI function calling. An env with tools
of its own (`TextEnv.tool_schemas()`) has them offered, and each call becomes the action text
`env.tool_call_action(name, arguments)`; any other env is offered one tool, `act(action)`, whose
call becomes `action_template` filled with its argument (default "<answer>{action}</answer>").
A call's result, the new observation, goes back as a `tool` message with the call's id. Several
calls in one answer are several env steps (their rewards summed into that turn's score); an
answer without a call is a text action. Its env settings also accept `action_template`.

Both stop when the env terminates or truncates, after `max_steps` actions, or when the proxy
refuses a request for lack of room (`max_tokens`); another refused call ends the episode as
"Failed". `agent_exit_reason` is the env's `info["end_reason"]` when it gives one, else the stop
reason; `metrics` are the env's episode metrics (ToolCallRunner adds `tool_calls`). The page:
docs/agent_proxy.md ("Built in").
"""

from __future__ import annotations

import json

import openai

from roll.agentic.env.base import TextEnv
from roll.agentic.env.faults import FaultInjectingEnv
from roll.agentic.env.registry import make_env, text_env_of
from roll.agentic.proxy.runner import AgentRunner, EpisodeResult
from roll.agentic.templates import traj_turn_text

ACT_TOOL = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Take one action in the environment; returns the new observation.",
        "parameters": {
            "type": "object",
            "properties": {"action": {"type": "string", "description": "the action, e.g. Left"}},
            "required": ["action"],
        },
    },
}


class _Episode:
    """An episode's running totals."""

    def __init__(self) -> None:
        self.step_scores: list[float] = []
        self.stop_reason = "max_steps"
        self.info: dict = {}
        self.actions = 0
        self.tool_calls = 0  # actions that came as tool calls (ToolCallRunner)


class GEMRunner(AgentRunner):
    """See the module docstring."""

    def __init__(self, base_url: str, env_id: int | str, env_config: dict, **kwargs):
        super().__init__(base_url, env_id, env_config, **kwargs)
        self.max_steps = int(self.env_config.get("max_steps", 10))
        self.system_template = self.env_config.get("agent_system_template")
        self.agent_template = self.env_config.get("agent_template")
        self.instruction = self.env_config.get("instruction")
        self.env: TextEnv | FaultInjectingEnv | None = None
        self.setup()

    def setup(self) -> None:
        params = dict(self.env_config.get("env_config") or {})
        self.env = make_env(self.env_config["env_type"], params)

    def teardown(self) -> None:
        if self.env is not None:
            self.env.close()

    @property
    def _env(self) -> TextEnv | FaultInjectingEnv:
        assert self.env is not None  # setup() makes it in the constructor
        return self.env

    def user_text(self, observation: str, turn: int) -> str:
        """The user message of turn `turn` (0-based)."""
        if self.agent_template is None:
            return observation
        return traj_turn_text(
            self.agent_template,
            observation,
            turn,
            self.max_steps - turn,
            int(self.env_config.get("max_tokens_per_step", 128)),
        )

    def first_messages(self, observation: str, info: dict) -> list[dict]:
        instruction = info.get("env_instruction", "")
        if self.system_template is not None:
            system = f"{self.system_template}\n\n{instruction}" if instruction else self.system_template
        else:
            system = instruction if self.instruction is None else self.instruction
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [{"role": "user", "content": self.user_text(observation, 0)}]

    def step(self, state: _Episode, action: str) -> tuple[str, float, bool]:
        """One env step; returns (observation, reward, done) and keeps the totals."""
        observation, reward, terminated, truncated, info = self._env.step(action)
        state.actions += 1
        state.info = info
        if terminated or truncated:
            state.stop_reason = "terminated" if terminated else "truncated"
        return observation, float(reward), terminated or truncated

    def run_job(self, seed: int) -> EpisodeResult:
        observation, info = self._env.reset(seed=seed)
        messages = self.first_messages(observation, info)
        state, client = _Episode(), self.client()
        try:
            for turn in range(self.max_steps):
                message = client.chat.completions.create(model=self.model, messages=messages).choices[0].message
                text = message.content or ""
                observation, reward, done = self.step(state, text)
                state.step_scores.append(reward)
                if done:
                    break
                messages += [{"role": "assistant", "content": text}]
                messages += [{"role": "user", "content": self.user_text(observation, turn + 1)}]
        except openai.APIStatusError as e:
            return self.refused(state, e)
        return self.result(state)

    def refused(self, state: _Episode, error: openai.APIStatusError) -> EpisodeResult:
        if error.status_code == 400 and "no room to generate" in str(error):
            state.stop_reason = "max_tokens"
            return self.result(state)
        return EpisodeResult(
            status="Failed", step_scores=state.step_scores, agent_exit_reason=f"{error.status_code}: {error}"
        )

    def result(self, state: _Episode) -> EpisodeResult:
        return EpisodeResult(
            score=sum(state.step_scores),
            step_scores=state.step_scores,
            success=bool(state.info.get("success", False)),
            stop_reason=state.stop_reason,
            agent_exit_reason=str(state.info.get("end_reason") or state.stop_reason),
            metrics={k: float(v) for k, v in (state.info.get("metrics") or {}).items()},
        )


class ToolCallRunner(GEMRunner):
    """See the module docstring."""

    def __init__(self, base_url: str, env_id: int | str, env_config: dict, **kwargs):
        super().__init__(base_url, env_id, env_config, **kwargs)
        self.action_template = str(self.env_config.get("action_template", "<answer>{action}</answer>"))
        self.env_tools = text_env_of(self._env).tool_schemas()
        self.tools = self.env_tools or [ACT_TOOL]

    def run_job(self, seed: int) -> EpisodeResult:
        observation, info = self._env.reset(seed=seed)
        messages = self.first_messages(observation, info)
        state, client = _Episode(), self.client()
        try:
            while state.actions < self.max_steps:
                response = client.chat.completions.create(model=self.model, messages=messages, tools=self.tools)
                message = response.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                turn_reward, done = 0.0, False
                if not message.tool_calls:
                    observation, turn_reward, done = self.step(state, message.content or "")
                    messages.append({"role": "user", "content": self.user_text(observation, state.actions)})
                for call in message.tool_calls or []:
                    if done or state.actions >= self.max_steps:
                        break
                    state.tool_calls += 1
                    observation, reward, done = self.step(state, self.action_text(call))
                    turn_reward += reward
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
                state.step_scores.append(turn_reward)
                if done:
                    break
        except openai.APIStatusError as e:
            return self.refused(state, e)
        result = self.result(state)
        result.metrics["tool_calls"] = float(state.tool_calls)
        return result

    def action_text(self, call) -> str:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            arguments = {}
        if self.env_tools:
            return text_env_of(self._env).tool_call_action(call.function.name, arguments)
        action = arguments.get("action", "") if isinstance(arguments, dict) else ""
        return self.action_template.format(action=action)
