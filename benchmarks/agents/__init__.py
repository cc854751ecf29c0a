"""Agents outside the trainer: the chat proxy's overhead and phases, the sandbox's cost."""
