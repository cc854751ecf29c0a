"""Agents that call us: a loopback OpenAI-compatible chat server (`server.ProxyServer`) whose
calls are recorded per episode (`recorder.EpisodeRecorder`) and become training samples of the
engine's own token ids. docs/agent_proxy.md describes the whole path."""
