"""Many envs at once: memory per env and steps/s, and our envs measured as ROLL's were."""
