"""The README stays short, keeps its two set-up commands, and its custom-env example runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_short_and_keeps_the_two_set_up_commands() -> None:
    assert len(README.encode()) <= 15_000
    commands = re.findall(r"```bash\n# \d\. .*\n(.*)\n```", README)
    assert commands[:2] == [
        "pip install -r requirements.txt -e . && bash examples/frozen_lake/run_agentic_pipeline_frozen_lake.sh",
        'pip install -r requirements.txt -e ".[test]" && bash scripts/install_gem.sh && python -m pytest -q',
    ]


def test_the_custom_env_example_plays_an_episode() -> None:
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", README, re.S).group(1), namespace)
    env = namespace["Guess"]()
    observation, _ = env.reset(seed=3)
    assert observation == "Guess a number."
    _, reward, terminated, truncated, _ = env.step("no answer tag")
    assert (reward, terminated, truncated) == (env.format_penalty, False, False)
    _, reward, terminated, _, _ = env.step(f"<answer>{env.target}</answer>")
    assert (reward, terminated, env.success) == (1.0, True, True)
