"""A coding / terminal env: fix or write a function in a sandboxed workspace; hidden tests grade it."""

from envs.code_sandbox.env import CodeSandboxEnv
from envs.code_sandbox.tasks import TASKS, CodeTask

__all__ = ["TASKS", "CodeSandboxEnv", "CodeTask"]
