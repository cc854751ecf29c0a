"""The pieces of one training step that `AgenticPipeline.run()` calls, by phase: what a rollout
keeps (`recorded_rollout`: ROLL's dump and mock), trajectories into a batch (`batch`), scoring
(`scoring`), which roles hold their GPUs in each phase (`gpu_offload`), the step's idle time per
role (`idle_time`) and checkpoints (`checkpoint`).

The bottom room of roll/pipeline: these import no other module of roll/pipeline.
"""
