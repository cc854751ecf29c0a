"""Learning: the examples' curves over seeds, GiGPO against GRPO, random baselines, where a policy errs."""
