"""The pipeline's own Ray (`init_ray` without `ray_address`): every socket of its processes
listens on loopback; `RAY_ADDRESS` joins a running instance (no num_cpus passed); a Ray started
with `ray start` on this machine (its address in `ray_current_cluster`) is not joined; the private
instance's GCS keeps a bounded task history."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from roll.pipeline.setup.cluster import TASK_EVENTS_IN_GCS

REPO = Path(__file__).resolve().parents[2]
PROBE = [sys.executable, str(Path(__file__).parents[1] / "lanes" / "ray_probe.py")]
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
pytestmark = pytest.mark.ray


def probe_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env | extra


def run_probe(**extra) -> dict:
    proc = subprocess.run(PROBE, env=probe_env(**extra), cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_local_ray_listens_on_loopback_only_and_existing_instances_are_handled():
    held = subprocess.Popen(
        PROBE + ["hold"],
        env=probe_env(),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(held.stdout.readline())
        # 1. loopback only: GCS, raylet (node manager, object manager), agents, driver and worker
        assert first["joined"] is False
        names = {name for name, _, _ in first["listening"]}
        assert {"gcs_server", "raylet"} <= names, first["listening"]
        assert any(n.startswith("ray::") and not n.endswith("Agent") for n in names), first["listening"]  # a worker
        outside = [s for s in first["listening"] if s[1] not in LOOPBACK]
        assert outside == [], f"listening outside loopback: {outside}"
        assert first["gcs"].startswith("127.0.0.1:")
        assert first["task_events_in_gcs"] == TASK_EVENTS_IN_GCS  # a bounded task history in its GCS
        # 2. RAY_ADDRESS set: joined, without Ray's "num_cpus must not be provided"
        joined = run_probe(RAY_ADDRESS=first["gcs"])
        assert joined["joined"] is True and joined["gcs"] == first["gcs"]
        # 3. a `ray start` instance recorded in ray_current_cluster: a private instance instead
        with tempfile.TemporaryDirectory(prefix="r", dir="/tmp") as tmp:  # short: Ray's socket paths
            (Path(tmp) / "ray").mkdir()
            (Path(tmp) / "ray" / "ray_current_cluster").write_text(first["gcs"])
            private = run_probe(RAY_TMPDIR=tmp, RAY_task_events_max_num_task_in_gcs="777")
        assert private["joined"] is False and private["gcs"] != first["gcs"]
        assert private["task_events_in_gcs"] == 777  # the user's own setting wins
        # 4. kill -9 of the driver: every process it started goes with it (Ray's agents alone
        # would wait out a 60 s report to the dead GCS first)
        started = [
            p
            for p in psutil.Process(held.pid).children(recursive=True)
            if p.name() != "python" or "roll.pipeline.failures.reaper" not in " ".join(p.cmdline())
        ]
        assert {"gcs_server", "raylet"} <= {p.name() for p in started}
        held.kill()
        held.wait(timeout=10)
        _, left = psutil.wait_procs(started, timeout=30)
        assert [p.pid for p in left] == [], f"still running after the driver's kill -9: {left}"
    finally:
        held.stdin.close()
        held.wait(timeout=60)
