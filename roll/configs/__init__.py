"""Pydantic models mirroring the run YAML 1:1, and the loader that composes and validates it."""

from roll.configs.base import ConfigError, ConfigModel, InvalidField
from roll.configs.env import CustomEnvConfig, EnvManagerConfig
from roll.configs.loader import load_config, validate_config
from roll.configs.pipeline import PipelineConfig
from roll.configs.worker import (
    GeneratingArgs,
    ModelArgs,
    StrategyArgs,
    TrainingArgs,
    WorkerConfig,
)

__all__ = [
    "ConfigError",
    "ConfigModel",
    "CustomEnvConfig",
    "EnvManagerConfig",
    "GeneratingArgs",
    "InvalidField",
    "ModelArgs",
    "PipelineConfig",
    "StrategyArgs",
    "TrainingArgs",
    "WorkerConfig",
    "load_config",
    "validate_config",
]
