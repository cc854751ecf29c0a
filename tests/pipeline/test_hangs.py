"""A call on a worker that never returns ends the run with one line naming the phase, the step, the
bound and the process that does not answer (roll/pipeline/failures/hangs.py), against real Ray actors: one
stuck in a call (a training step that never returns), one idle."""

import threading

import pytest
import ray

from roll.core.errors import RunStopped
from roll.pipeline.failures.hangs import WorkerHung, hang_line, named_hangs, unanswering

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self):
        self.release = threading.Event()

    def train_step(self) -> str:
        self.release.wait(60)  # a collective whose peer never comes, a wedged device
        return "done"

    def ping(self) -> bool:
        return True


class Residency:
    """The two things `named_hangs` asks of `PhaseResidency`."""

    def __init__(self, phase: str, handles: dict):
        self.phase, self._handles = phase, handles

    def handles(self, roles=None) -> dict:
        return {key: h for key, h in self._handles.items() if roles is None or key[0] in roles}


@pytest.fixture(scope="module")
def actors():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    stuck, idle, infer = Trainer.remote(), Trainer.remote(), Trainer.remote()
    ray.get([a.ping.remote() for a in (stuck, idle, infer)])
    yield stuck, idle, infer
    ray.shutdown()


def test_a_training_call_over_the_bound_names_the_phase_step_and_the_stuck_rank(actors):
    stuck, idle, infer = actors
    ref = stuck.train_step.remote()
    residency = Residency("train", {("actor_train", 0): stuck, ("actor_train", 1): idle, ("actor_infer", 0): infer})
    with pytest.raises(WorkerHung) as caught:
        with named_hangs(residency, 2.0, lambda: 7, lambda: "/ckpt/step_5"):
            ray.get(ref, timeout=2.0)
    assert str(caught.value) == hang_line("train", 7, 2.0, ["actor_train process 0"], "/ckpt/step_5")
    assert caught.value.line() == (
        "training stopped: hang: step 7, phase train: a call on a worker did not return within 2 s "
        "(rpc_timeout); not answering: actor_train process 0; last checkpoint: /ckpt/step_5; resume with "
        "resume_from_checkpoint=true once it is fixed, or raise rpc_timeout if the call is only slow"
    )
    assert isinstance(caught.value, RunStopped) and caught.value.exit_code == 1


def test_probes_name_only_the_processes_that_do_not_answer(actors):
    stuck, idle, _ = actors
    stuck.train_step.remote()
    assert unanswering({"a": stuck, "b": idle}, probe_s=1.0) == ["a"]
    assert unanswering({}, probe_s=1.0) == []


def test_other_errors_pass_through_unchanged():
    residency = Residency("score", {})
    with pytest.raises(ValueError, match="not a hang"):
        with named_hangs(residency, 1.0, lambda: 1, lambda: None):
            raise ValueError("not a hang")
    assert "last checkpoint: none" in hang_line("score", 1, 1.0, [], None)
    assert "every process of the phase answers a probe" in hang_line("score", 1, 1.0, [], None)
