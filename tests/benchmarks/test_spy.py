"""benchmarks/reliability/spy.py: py-spy's raw stacks summarised per thread (the GPU lane's `--spy`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from benchmarks.reliability import spy

REPO = Path(__file__).resolve().parents[2]

RAW = """thread (11): MainThread;main (a.py:1);work (a.py:5) 30
thread (11): MainThread;main (a.py:2);wait (a.py:9) 10
thread (12): PythonGCThread;loop (b.py:3) 40
thread (12): PythonGCThread;loop (b.py:4);tick (b.py:8) 10
"""


def test_each_thread_gets_its_inclusive_and_self_shares(tmp_path):
    path = tmp_path / "InferenceWorker-11.txt"
    path.write_text(RAW)
    text = spy.summarize(path)
    main, gc = text.split("-- thread (12)")
    assert "-- thread (11): MainThread: 40 samples, 2 distinct stacks" in main
    assert "100.0%  main (a.py)" in main  # line numbers folded: one function, both stacks
    assert " 75.0%  work (a.py)" in main and " 25.0%  (self) wait (a.py)" in main
    assert ": PythonGCThread: 50 samples" in gc and " 20.0%  (self) tick (b.py)" in gc


def test_summarize_command_reads_a_folder(tmp_path, capsys):
    (tmp_path / "driver-1.txt").write_text(RAW)
    (tmp_path / "EnvWorker-2.txt").write_text("main (c.py:1) 5\n")
    assert spy.main(["summarize", str(tmp_path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.index("== EnvWorker-2.txt") < out.index("== driver-1.txt")
    assert "-- all threads: 5 samples" in out


def test_the_processes_of_a_session_are_named_by_role():
    """A session like a run's: its leader (the CLI) is the driver, a Ray worker is named by its
    actor class, an idle Ray worker is left out, and nothing outside the session is listed."""
    script = "(exec -a ray::EnvWorker sleep 30) & (exec -a ray::IDLE sleep 30) & wait"
    leader = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        for _ in range(100):  # until both children have exec'd
            found = spy.session_processes(leader.pid)
            if len(found) == 2:
                break
            time.sleep(0.05)
        assert sorted(role for _, role in found) == ["EnvWorker", "driver"]
        assert (leader.pid, "driver") in found
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
