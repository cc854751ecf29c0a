"""Failures and hangs: time to a named hang report, the soak run, py-spy stacks of a run."""
