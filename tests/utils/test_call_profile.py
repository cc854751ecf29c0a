import pytest
import torch

from roll.utils.call_profile import parse_calls, profiled


class Worker:
    """A worker."""

    def __init__(self):
        self.weight = torch.ones(4, 4)

    def train(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight @ x).sum()

    def other(self) -> int:
        return 7


def test_parse_calls():
    assert parse_calls("train@20, compute_logprobs@3") == {"train": 20, "compute_logprobs": 3}
    assert parse_calls("") == {}
    for bad in ("train", "train@0", "train@x", "1x@2"):
        with pytest.raises(ValueError, match="ROLL_PROFILE_CALLS"):
            parse_calls(bad)


def test_unset_or_unknown_methods_leave_the_class_alone():
    assert profiled(Worker, {}) is Worker
    assert profiled(Worker, {"ROLL_PROFILE_CALLS": "generate@1"}) is Worker


def test_only_the_nth_call_is_profiled_and_results_are_unchanged(tmp_path):
    cls = profiled(Worker, {"ROLL_PROFILE_CALLS": "train@2", "ROLL_PROFILE_DIR": str(tmp_path)})
    assert issubclass(cls, Worker) and cls.__name__ == "Worker" and cls.__doc__ == "A worker."
    worker, x = cls(), torch.arange(4.0)
    assert float(worker.train(x)) == 24.0
    assert list(tmp_path.iterdir()) == []
    assert float(worker.train(x)) == 24.0  # the second call: profiled
    (report,) = tmp_path.iterdir()
    assert report.name.startswith("Worker.train.2.")
    text = report.read_text()
    assert text.startswith("wall_s ") and "aten::sum" in text and "Self CPU time total" in text
    worker.train(x)
    assert worker.other() == 7 and len(list(tmp_path.iterdir())) == 1
