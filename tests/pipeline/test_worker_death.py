"""A dead worker is named with its real cause (issue 31), from Ray's own messages as Ray 2.60
words them (copied from real deaths: a constructor that raised, a kill -9, a SIGSEGV)."""

from __future__ import annotations

from ray.exceptions import ActorDiedError, OutOfMemoryError

from roll.pipeline.failures import worker_death
from roll.pipeline.failures.worker_death import death_line, oom_kill_count

RESUME = "resume from the last checkpoint (/o/checkpoints/step_2) with resume_from_checkpoint=true"
DIED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: InferenceWorker\n\tactor_id: d093f0a1\n"
    "\tpid: 4989\n\tnamespace: 8bc3\n\tip: 127.0.0.1\nThe actor is dead because its worker process has died. "
    "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. "
    "End of file. Some common causes include: (1) the process was killed by the OOM killer due to high memory usage"
)
INIT_FAILED = (
    "The actor died because of an error raised in its creation task, \x1b[36mray::ActorWorker.__init__()\x1b[39m "
    '(pid=5068, ip=127.0.0.1, actor_id=d604b237)\n  File "/x/loading.py", line 6, in __init__\n'
    '    raise ValueError(...)\nValueError: Specified `attn_implementation="bogus"` is not supported.'
)


class Died(ActorDiedError):
    """ActorDiedError with the message Ray builds from its death context (built here from text)."""

    def __init__(self, message: str, init_failed: bool = False):
        super().__init__()
        self.error_msg, self._actor_init_failed = message, init_failed

    def __str__(self) -> str:
        return self.error_msg


def test_a_constructor_that_raised_is_named_and_resuming_is_not_advised():
    assert death_line(Died(INIT_FAILED, init_failed=True), "/o/checkpoints/step_2") == (
        "a worker process could not start (ActorWorker, pid 5068): ValueError: Specified "
        '`attn_implementation="bogus"` is not supported.; resuming will not help until what it names is fixed'
    )


def test_a_kill_without_a_word_is_said_as_such(tmp_path):
    assert death_line(Died(DIED), "/o/checkpoints/step_2", tmp_path) == (
        f"a worker process died (InferenceWorker, pid 4989): it was killed without a word, as kill -9 kills; {RESUME}"
    )


def test_a_fatal_signal_is_read_from_the_workers_log(tmp_path):
    log = tmp_path / "worker-a081ec12-01000000-4989.err"
    log.write_text(":job_id:01000000\n*** SIGSEGV received at time=1795741883 on cpu 0 ***\nPC: @ 0x7fa5\n")
    assert death_line(Died(DIED), "/o/checkpoints/step_2", tmp_path) == (
        f"a worker process died (InferenceWorker, pid 4989): SIGSEGV, reported in {log}; {RESUME}"
    )


def test_lack_of_memory_is_named_from_ray_or_the_kernels_count(tmp_path, monkeypatch):
    expected = (
        "a worker process was killed for lack of memory ({}); lower the batch sizes or give the run more memory, "
        f"then {RESUME}"
    )
    assert death_line(
        OutOfMemoryError("Task was killed due to the node running low on memory."), "/o/checkpoints/step_2"
    ) == (expected.format("unknown"))
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    monkeypatch.setattr(worker_death, "MEMORY_EVENTS", events)
    monkeypatch.setattr(worker_death, "oom_kill_count", lambda path=events: oom_kill_count(path))
    worker_death.remember_oom_count()
    assert death_line(Died(DIED), "/o/checkpoints/step_2") != expected.format("InferenceWorker, pid 4989")
    events.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    assert death_line(Died(DIED), "/o/checkpoints/step_2") == expected.format("InferenceWorker, pid 4989")
    worker_death._oom_count_at_start = None


def test_the_oom_count_is_read_from_memory_events(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 7\noom_group_kill 0\n")
    assert oom_kill_count(events) == 7 and oom_kill_count(tmp_path / "absent") is None
