"""The pure parts of `roll.pipeline.setup.cluster`: which Ray a run uses, the one line for a refused
join, placement.json. The cluster itself is exercised by .ci/run_cluster (root)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from ray.exceptions import AuthenticationError

from roll.pipeline.setup import cluster

REPO = Path(__file__).resolve().parents[2]


def test_ray_address_wins_over_the_environment_and_neither_means_local(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert cluster.ray_target("10.0.0.1:6379") == "10.0.0.1:6379"
    assert cluster.ray_target(None) == "10.0.0.9:6379"
    monkeypatch.setenv("RAY_ADDRESS", "")
    assert cluster.ray_target(None) is None


def test_a_refused_token_is_one_line_naming_the_token_path():
    try:
        try:
            raise AuthenticationError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")
        except AuthenticationError as auth:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from auth
    except ConnectionError as err:
        line = cluster._join_failure("ray_address", "10.0.0.1:6379", err)
    assert "\n" not in line and line.startswith("ray_address=10.0.0.1:6379: Ray token authentication failed")
    assert "RAY_AUTH_TOKEN_PATH" in line
    other = cluster._join_failure("RAY_ADDRESS", "10.0.0.1:6379", ConnectionError("no route\nto host"))
    assert other == "RAY_ADDRESS=10.0.0.1:6379: cannot join the Ray cluster (ConnectionError: no route to host)"


def test_placement_json_lists_every_process_and_the_distinct_nodes(tmp_path, capsys):
    rows = [
        {"role": "actor_train", "rank": 0, "node_ip": "10.0.0.2", "node_id": "b" * 56, "devices": "cpu"},
        {"role": "actor_train", "rank": 1, "node_ip": "10.0.0.3", "node_id": "c" * 56, "devices": "cpu"},
        {"role": "env_worker:train", "rank": 0, "node_ip": "10.0.0.2", "node_id": "b" * 56, "devices": "cpu"},
    ]
    path = cluster.write_placement(str(tmp_path / "out"), rows)
    assert json.loads(path.read_text()) == {"nodes": ["10.0.0.2", "10.0.0.3"], "processes": rows}
    table = capsys.readouterr().err.splitlines()
    assert table[2].split() == ["actor_train", "0", "10.0.0.2", "b" * 12, "cpu"] and len(table) == 5


def test_joining_a_closed_port_exits_2_with_one_line_naming_the_address(tmp_path):
    """Nothing listens at the address: the CLI says so in one line and exits 2 (it once waited out
    Ray's 20 GCS connection tries, minutes). Bounded time is what the design gives; asserted here
    is the outcome, not the seconds, which a loaded CI machine would make flaky."""
    from roll.pipeline.tiny_model import main as build

    model = build(["--preset", "frozen_lake", "--output_dir", str(tmp_path / "model")])
    with socket.socket() as probe:  # a port that was free a moment ago: closed now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "frozen_lake",
        "--config_name",
        "agent_val_frozen_lake",
        f"pretrain={model}",
        f"output_dir={tmp_path / 'run'}",
        f"ray_address=127.0.0.1:{port}",
        "max_steps=1",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"cluster error: ray_address=127.0.0.1:{port}: cannot join the Ray cluster: nothing listens at "
        f"127.0.0.1:{port} (connection refused); start its head with `ray start --head --port=PORT` "
        "or correct the address"
    )


def test_only_nodes_of_training_or_inference_processes_stop_the_run(monkeypatch):
    monkeypatch.setattr(cluster, "_run_nodes", None)
    assert cluster.split_lost({"n2"}, cluster._run_nodes) == ({"n2"}, set())  # before placement: any node
    rows = [
        {"role": "actor_train", "rank": 0, "node_id": "n1"},
        {"role": "actor_train", "rank": 1, "node_id": "n2"},
        {"role": "actor_infer", "rank": 0, "node_id": "n1"},
        {"role": "env_worker:train", "rank": 0, "node_id": "n3"},
        {"role": "env_worker:val", "rank": 0, "node_id": "n2"},
    ]
    cluster.stop_on_loss_of(rows)
    assert cluster._run_nodes == {"n1", "n2"}
    assert cluster.split_lost({"n3"}, cluster._run_nodes) == (set(), {"n3"})
    assert cluster.split_lost({"n2", "n3"}, cluster._run_nodes) == ({"n2"}, {"n3"})
    cluster.stop_on_loss_of(rows + [{"role": "critic", "rank": 0, "node_id": "pending"}])
    assert cluster.split_lost({"n3"}, cluster._run_nodes) == ({"n3"}, set())  # where the critic is, unknown


def test_lost_nodes_names_only_nodes_that_stop_the_run(monkeypatch):
    """After a node of env workers only was let go, a later stop (Ctrl-C, a worker's own error)
    is not reported as that node's loss."""
    monkeypatch.setattr(cluster, "_nodes_at_start", {"n1": "10.0.0.1", "n3": "10.0.0.3"})
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(
        cluster.ray, "nodes", lambda: [{"NodeID": "n1", "Alive": True}, {"NodeID": "n3", "Alive": False}]
    )
    monkeypatch.setattr(cluster, "_run_nodes", None)  # before placement: any lost node stops the run
    assert cluster.lost_nodes() == ["10.0.0.3 (node n3)"]
    monkeypatch.setattr(cluster, "_run_nodes", {"n1"})  # n3 held env workers only
    assert cluster.lost_nodes() == []
