"""What goes wrong during a run, recognised and said in one line: a call that never returns
(`hangs`), a worker process that died and why (`worker_death`), a full disk (`disk_full`), a run
that diverged or learns from the wrong numbers (`divergence`), and the processes a killed run
leaves behind (`reaper`).

Above `phases` (a hang names the phase its roles were in), below `setup`.
"""
