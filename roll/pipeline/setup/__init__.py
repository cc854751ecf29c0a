"""The edge where config becomes objects: Ray (`cluster`: local or joined, where each process
landed), placement and the worker actors (`builders`), the rollout side (`rollout_builders`: env
workers, their scheduler, env specs and sampling parameters), the cores and threads each process
gets (`cpu_shares`), and which way weights go to the engines (`sync_path`).

Only these functions read `PipelineConfig`; the classes they build take plain arguments. Above
`phases` and `failures`; `roll.pipeline.run_setup` runs `checks` and then this room.
"""
