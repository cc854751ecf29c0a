"""The pure parts of `roll.pipeline.cluster`: which Ray a run uses, the one line for a refused
join, placement.json. The cluster itself is exercised by .ci/run_cluster (root)."""

import json

from ray.exceptions import AuthenticationError

from roll.pipeline import cluster


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
    rows = [{"role": "actor_train", "rank": 0, "node_ip": "10.0.0.2", "node_id": "b" * 56, "devices": "cpu"},
            {"role": "actor_train", "rank": 1, "node_ip": "10.0.0.3", "node_id": "c" * 56, "devices": "cpu"},
            {"role": "env_worker:train", "rank": 0, "node_ip": "10.0.0.2", "node_id": "b" * 56, "devices": "cpu"}]
    path = cluster.write_placement(str(tmp_path / "out"), rows)
    assert json.loads(path.read_text()) == {"nodes": ["10.0.0.2", "10.0.0.3"], "processes": rows}
    table = capsys.readouterr().err.splitlines()
    assert table[2].split() == ["actor_train", "0", "10.0.0.2", "b" * 12, "cpu"] and len(table) == 5
