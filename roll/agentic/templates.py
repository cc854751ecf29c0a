"""ROLL's prompt templates (`custom_envs.<Tag>.agent_template` / `agent_system_template`), filled
as ROLL's env managers fill them (roll/pipeline/agentic/env_manager/{traj,step}_env_manager.py):
plain `str.format` with the placeholders of `roll.configs.templates` (TRAJ_FIELDS, STEP_FIELDS); a
placeholder outside these is a config error.
"""

from __future__ import annotations

from roll.configs.templates import placeholders


def _fill(template: str, values: dict) -> str:
    used = placeholders(template)
    missing = sorted(used - set(values))
    if missing:  # e.g. a step-wise placeholder in a trajectory-wise run
        raise ValueError(f"agent_template placeholder {{{missing[0]}}} is not filled by this env manager type")
    return template.format(**{k: v for k, v in values.items() if k in used})


def traj_turn_text(
    template: str,
    observation: str,
    turn: int,
    actions_left: int,
    max_response_length: int,
    instruction: str | None = None,
) -> str:
    """The user message of trajectory-wise turn `turn` (0-based); the first turn starts with the
    env's instruction and a newline, as in ROLL."""
    text = _fill(
        template,
        {
            "observation": observation,
            "turn_idx": turn + 1,
            "actions_left": actions_left,
            "max_response_length": max_response_length,
            "suffix": "",
        },
    )
    return f"{instruction}\n{text}" if turn == 0 and instruction else text


def step_prompt_text(
    template: str,
    *,
    env_instruction: str,
    history: list[tuple[str, str, float]],
    step: int,
    observation: str,
    max_response_length: int,
    concat: bool = False,
) -> str:
    """The user message of step-wise step `step` (0-based); `history` holds the shown earlier
    steps, oldest first, as (observation, action, reward). With `concat` (ROLL's
    StepConcatEnvManager, for GEM) `{history}` is those observations alone, one per line."""
    first = step - len(history)
    entries = [
        f"(step: {first + i + 1}, observation: {obs}, action: {action}, reward: {reward})"
        for i, (obs, action, reward) in enumerate(history)
    ]
    if concat:
        return _fill(template, {"history": "\n".join(obs for obs, _, _ in history), "current_observation": observation})
    return _fill(
        template,
        {
            "env_instruction": env_instruction or "",
            "history": ", ".join(entries),
            "step_count": step,
            "history_length": len(history),
            "current_step": step + 1,
            "current_observation": observation,
            "max_response_length": max_response_length,
        },
    )
