"""The GPU lanes (`.ci/run_gpu`, `.ci/run_gpu_e2e`, `.ci/run_gpu_session`) and the floors they compare to."""
