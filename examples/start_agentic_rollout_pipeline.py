"""`python examples/start_agentic_rollout_pipeline.py --config_path DIR --config_name NAME [key=val ...]`

ROLL's rollout-only entry point: `actor_infer` plays `train_env_manager`'s envs for `max_steps`
steps and nothing trains (roll.pipeline.rollout_pipeline), whether or not the config has
`actor_train` (a config without it runs this way from start_agentic_pipeline.py too)."""

import os
import sys

from roll.cli import main

if __name__ == "__main__":
    sys.exit(main(examples_dir=os.path.dirname(os.path.abspath(__file__)), rollout_only=True))
