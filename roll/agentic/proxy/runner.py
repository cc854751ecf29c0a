"""The runner interface: the only code a user writes to train an agent through the proxy.

ROLL's `AgentRunner` (roll/pipeline/agentic/agent_runner/base.py), with ROLL's constructor and
result so that a runner written for ROLL runs here unchanged:

- `AgentRunner(base_url, env_id, env_config, **kwargs)`: one runner per env slot, built once;
  `env_config` is the tag's settings as a dict (`env_type`, `env_config`, `max_steps`,
  `max_tokens_per_step`, `agent_system_template`, `agent_template`, `model`, ...). A runner does
  its one-time setup in its constructor (ROLL's `setup()` convention) and `teardown()` is called
  when its env manager is dropped.
- `run_job(seed) -> EpisodeResult` plays one episode; `seed` is the group's env seed (the members
  of a group share it). It may be a plain function (run in a thread of its own, so a blocking
  agent stalls nobody) or a coroutine function (awaited on the env worker's loop).
- The model is reached only through `base_url` (the proxy: `{base_url}/v1/chat/completions`) with
  `api_key` as the bearer token. Unlike ROLL (whose token is the fixed `env_id`), each episode has
  its own token: the env manager sets `api_key` before every `run_job`, and a call made with an
  old token is refused. `client()` is an `openai.OpenAI` client set up this way; pointing
  `base_url` and `api_key` at a real service runs the same agent in production.

`EpisodeResult` is ROLL's (`status` "Finished" | "Failed" | "NoData" | "Timeout", `score`,
`step_scores`, `agent_exit_reason`, `metrics`) plus two optional fields of ours: `success`
(None: score > 0) and `stop_reason` ("terminated", "truncated", "max_steps", "max_tokens"; None:
"terminated", or "max_tokens" when the proxy refused a request for lack of room). Any status but
"Finished" drops the episode with its exit reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FINISHED = "Finished"


@dataclass
class EpisodeResult:
    status: str = FINISHED
    score: float = 0.0
    step_scores: list[float] = field(default_factory=list)
    agent_exit_reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    success: bool | None = None
    stop_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """ROLL's flat form."""
        return {
            "status": self.status,
            "score": self.score,
            "step_scores": self.step_scores,
            "agent_exit_reason": self.agent_exit_reason,
            **self.metrics,
        }


class AgentRunner:
    """Base class of runners (see the module docstring)."""

    def __init__(self, base_url: str, env_id: int | str, env_config: dict, **kwargs: Any):
        self.base_url = base_url
        self.env_id = env_id
        self.env_config = dict(env_config)
        self.api_key = ""  # the live episode's token, set by the env manager before each run_job
        self.model = str(self.env_config.get("model") or "roll-policy")
        self.http_timeout = float(self.env_config.get("http_timeout", 3600.0))

    def run_job(self, seed: int) -> EpisodeResult:
        raise NotImplementedError

    def setup(self) -> None:
        """One-time initialisation (ROLL's hook; call it from your constructor)."""

    def teardown(self) -> None:
        """Release what the runner holds (an env, a connection)."""

    def client(self):
        """An `openai.OpenAI` client of the live episode (no retries: a refused call is final). The
        runner's episodes share one connection pool (a new client costs tens of ms: TLS setup)."""
        import openai

        if getattr(self, "_client", None) is None:
            self._client = openai.OpenAI(
                base_url=f"{self.base_url}/v1", api_key="-", max_retries=0, timeout=self.http_timeout
            )
        return self._client.with_options(api_key=self.api_key)

    def _llm_request(self, client, messages: list[dict], tools: list[dict] | None = None, tool_choice: str = "auto"):
        """ROLL's helper: one chat completion through `client` (an `httpx.Client`) as a dict."""
        response = client.post(
            f"{self.base_url}/v1/chat/completions",
            json={"messages": messages, "tools": tools or None, "tool_choice": tool_choice if tools else None},
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        response.raise_for_status()
        return response.json()
