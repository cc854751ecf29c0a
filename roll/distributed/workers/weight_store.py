"""The weights an inference engine should serve now, for an engine that Ray restarts.

An inference worker killed in the middle of a run (`kill -9`, a crash) is restarted by Ray with
its constructor's arguments, which load the initial model. The pipeline therefore leaves the
weights of each sync here (a reference to them in Ray's object store, not a copy: the object
stays alive as long as this actor holds the reference, one model's worth of memory) with their
policy version; a restarted inference worker loads them before it serves anything
(`InferenceWorker.__init__`). Before the first sync the store is empty and the initial model is
the current one.
"""

from __future__ import annotations


class WeightStore:
    """Ray actor: the last synced weights (a one-element list holding their ObjectRef, so that Ray
    passes the reference and not the tensors) and their version."""

    def __init__(self) -> None:
        self.box: list = []
        self.version = 0

    def put(self, box: list, version: int) -> int:
        self.box, self.version = box, version
        return version

    def get(self) -> tuple[list, int]:
        return self.box, self.version
