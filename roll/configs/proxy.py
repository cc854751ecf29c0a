"""Config of the chat proxy that agent runners call (`<env manager>.proxy`; roll.agentic.proxy).

A tag whose `env_manager_cls` is ROLL's `ProxyEnvManager` (or ours) and whose `agent_runner_cls`
names a runner is played by that runner through a loopback OpenAI-compatible server, one per env
worker. These are the server's settings; the samples follow the manager's `env_manager_type`.
"""

from __future__ import annotations

from pydantic import Field

from roll.configs.base import ConfigModel


class ProxyConfig(ConfigModel):
    """The chat proxy of one env manager's workers."""

    model_name: str = Field("roll-policy", min_length=1)
    """The model name the proxy serves: requests naming another model are refused (400, `model`);
    requests naming none are served (ROLL's runners send none). Runners pass it as `model`."""
    episode_timeout_s: float = Field(600.0, gt=0)
    """Most seconds one `run_job` may take; over it the episode is dropped ("episode timeout"), its
    token revoked and its runner replaced."""
    max_body_bytes: int = Field(8 << 20, ge=1024)
    """Largest request body the proxy reads; a larger one is answered 413."""
