from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.strip() for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="roll",
    version="0.1.0",
    description="Agentic reinforcement learning of LLMs: env managers, Ray workers, PPO/GRPO.",
    python_requires=">=3.11",
    packages=find_packages(include=["roll", "roll.*", "envs", "envs.*"]),
    install_requires=requirements,
    extras_require={
        # DeepSpeed builds its C++ ops only when first used (we use none), so it installs in seconds.
        "deepspeed": ["deepspeed>=0.19.8,<0.20"],
        "test": ["pytest>=8", "pytest-timeout>=2.3", "deepspeed>=0.19.8,<0.20"],
    },
    # Built-in envs register through this entry point, exactly like a user's env package would.
    entry_points={"roll.envs": ["builtin = envs"]},
)
