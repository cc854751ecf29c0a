"""The rollout and the async loop: trajectories/s against the zero-latency bound, engine calls, partial
rollout, async against sync; `latency_env` is the slow FrozenLake they use."""
