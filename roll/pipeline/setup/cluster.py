"""Where the run's Ray comes from, and where its processes landed.

Two cases, decided once (`init_ray`) and said in one line on stderr:
- `ray_address` (or `RAY_ADDRESS`) set: join that cluster. Nothing about its size is passed (Ray
  refuses `num_cpus` when connecting); with Ray's token authentication on (the default of
  `ray start --head`) the driver needs the cluster's token (`RAY_AUTH_TOKEN_PATH` or
  `RAY_AUTH_TOKEN`), and a refusal ends in one line saying so (`ClusterError`, exit 2). An
  address where nothing listens fails within seconds, also in one line: a plain TCP connect
  first (`_nothing_listens`), and one GCS try instead of Ray's twenty (`_bounded_gcs_wait`).
- Neither set: a private local instance, even when another Ray runs on this machine (a user's
  `ray start --head` is not joined: `address="local"`), bound to 127.0.0.1 only. Ray's gRPC servers
  (GCS, raylet, object manager, core workers of the driver and actors) listen on loopback only when
  the node address is 127.0.0.1, and `ray.init` turns a loopback `_node_ip_address` into the
  machine's outward IP unless clusters are switched off (`ray_constants.ENABLE_RAY_CLUSTER`, set
  from `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` at import). So the switch is off while Ray starts, and
  the dashboard is not started. tests/pipeline/test_ray_local.py lists the sockets. Its GCS keeps
  the events of the last `TASK_EVENTS_IN_GCS` tasks, where Ray's default keeps 100,000, which a
  long run fills a little every step; `RAY_task_events_max_num_task_in_gcs` set by the user wins.
"""

from __future__ import annotations

import _thread
import json
import logging
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import ray

from roll.core.errors import RollError
from roll.distributed.rank_group import process_handles
from roll.pipeline.failures import reaper
from roll.utils.atomic import write_atomic
from roll.utils.polling import wait_until

LOOPBACK = "127.0.0.1"
TASK_EVENTS_IN_GCS = 10_000
_joined = False
_nodes_at_start: dict[str, str] = {}
"""Node id -> IP of the nodes alive when the run started (`lost_nodes`)."""
_run_nodes: set[str] | None = None
"""Node ids holding a training or inference process (`stop_on_loss_of`); None: not known yet, so
the loss of any node stops the run."""


class ClusterError(RollError, RuntimeError):
    """The cluster named by `ray_address` cannot be joined; `str()` is one line."""

    exit_code = 2
    prefix = "cluster error"


def ray_target(address: str | None) -> str | None:
    """The cluster to join: `ray_address`, else `RAY_ADDRESS`, else None (a private local Ray)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def _private_system_config() -> dict:
    """Ray settings of the private instance: a bounded task-event history in its GCS, unless the
    user set Ray's own variable for it."""
    if "RAY_task_events_max_num_task_in_gcs" in os.environ:
        return {}
    return {"task_events_max_num_task_in_gcs": TASK_EVENTS_IN_GCS}


def init_ray(address: str | None, system_envs: dict[str, str] | None = None) -> bool:
    """Start or join Ray (module docstring); returns whether the run joined a cluster.
    `system_envs` are set in this process and in every worker (the job's runtime_env)."""
    if ray.is_initialized():
        return ray_target(address) is not None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.update(system_envs or {})
    runtime_env = {"env_vars": dict(system_envs)} if system_envs else None
    target = ray_target(address)
    if target is None:
        reaper.start()  # Ray's processes end with this driver, even after a kill -9
        with _loopback_node():
            ray.init(
                address="local",
                num_cpus=os.cpu_count(),
                include_dashboard=False,
                _node_ip_address=LOOPBACK,
                logging_level=logging.ERROR,
                _system_config=_private_system_config(),
                runtime_env=runtime_env,
            )
        _remember_nodes()
        _say(
            "ray: started a private local instance on 127.0.0.1 (a Ray already running on this machine is "
            "not joined; set ray_address or RAY_ADDRESS to join a cluster)"
        )
        return False
    source = "ray_address" if address else "RAY_ADDRESS"
    hostport = target.split("://")[-1]
    host, _, port = hostport.rpartition(":")
    silent = _nothing_listens(hostport, host, port)
    if silent:
        raise ClusterError(
            f"{source}={target}: cannot join the Ray cluster: {silent}; start its head with "
            "`ray start --head --port=PORT` or correct the address"
        )
    _token_mode_if_token_available()
    try:
        with _loopback_node() if host in (LOOPBACK, "localhost") else _nothing(), _bounded_gcs_wait():
            ray.init(address=target, logging_level=logging.ERROR, runtime_env=runtime_env)
    except Exception as err:  # noqa: BLE001 - turned into one line naming the cause
        raise ClusterError(_join_failure(source, target, err)) from None
    global _joined
    _joined = True
    nodes = _remember_nodes()
    threading.Thread(target=_watch_nodes, name="roll-node-watch", daemon=True).start()
    _say(
        f"ray: joined the cluster at {target} ({source}): {len(nodes)} nodes, "
        f"{sum(n['Resources'].get('CPU', 0) for n in nodes):g} CPUs, "
        f"{sum(n['Resources'].get('GPU', 0) for n in nodes):g} GPUs"
    )
    return True


JOIN_PROBE_S = 5.0
"""How long the join waits for a TCP answer from the cluster's address before giving up."""
GCS_WAIT = "RAY_gcs_server_port_wait_time_s"
"""Ray's number of ~1 s-spaced tries to reach the GCS when joining (`ray._private.node`), read when
`ray.init` runs. Ray's default is 20 tries, each of which waits out its connect timeouts (about
35 s when the port answers but no GCS does): a dead address kept a run waiting 12 minutes."""


def _nothing_listens(hostport: str, host: str, port: str) -> str | None:
    """Why `hostport` (the cluster address without a ray:// scheme, split into `host` and `port`)
    cannot be a running cluster, seen from a plain TCP connect of at most `JOIN_PROBE_S`:
    "connection refused", "no answer within 5 s", an unknown host; None when something accepts the
    connection (or the address has no port, e.g. "auto", which Ray resolves itself)."""
    if not host or not port.isdigit():
        return None
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=JOIN_PROBE_S).close()
    except TimeoutError:
        return f"no answer from {hostport} within {JOIN_PROBE_S:g} s"
    except ConnectionRefusedError:
        return f"nothing listens at {hostport} (connection refused)"
    except OSError as err:
        return f"{hostport} cannot be reached ({err.strerror or err})"
    return None


@contextmanager
def _bounded_gcs_wait():
    """One GCS connection try instead of Ray's 20 while joining (`GCS_WAIT`), unless the user set
    the variable; so a port that answers but is no Ray head fails within a minute, not twelve."""
    preset = GCS_WAIT in os.environ
    if not preset:
        os.environ[GCS_WAIT] = "1"
    try:
        yield
    finally:
        if not preset:
            os.environ.pop(GCS_WAIT, None)


def _token_mode_if_token_available() -> None:
    """A driver joining a cluster sends Ray's token only in token mode, which Ray turns on by
    itself for a cluster it starts but not for one it joins: on when a token is at hand
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) and RAY_AUTH_MODE is unset."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _remember_nodes() -> list[dict]:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    _nodes_at_start.update({n["NodeID"]: n["NodeManagerAddress"] for n in nodes})
    return nodes


def _lost_ids() -> set[str] | None:
    """Ids of the nodes of the run's start that Ray now reports dead; None when Ray is down or its
    GCS is gone (nothing to ask)."""
    if not ray.is_initialized():
        return None
    try:
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    except Exception:  # noqa: BLE001 - the GCS itself is gone
        return None
    return set(_nodes_at_start) - alive


def _describe(nid: str) -> str:
    return f"{_nodes_at_start[nid]} (node {nid[:12]})"


def lost_nodes(wait_s: float = 0.0) -> list[str]:
    """The nodes of the run's start that Ray now reports dead and that stop the run (not those
    that held env workers only, `stop_on_loss_of`), as "IP (node id)"; waits up to `wait_s` for one
    to show (a worker's death may be reported before its node's)."""

    def probe() -> list[str] | None:
        lost = _lost_ids()
        if lost is None:  # the GCS itself is gone: nothing to say
            return []
        fatal, _ = split_lost(lost, _run_nodes)
        return [_describe(nid) for nid in _nodes_at_start if nid in fatal] or None

    return wait_until(probe, wait_s, interval_s=1.0) or []


def stop_on_loss_of(rows: list[dict]) -> None:
    """Once placed (`placement_rows`), only the nodes of training and inference processes stop the
    run when lost. A node that held env workers only is let go: Ray restarts them on the surviving
    nodes (they are started with `max_restarts=-1`, scheduled `SPREAD`) and the rollout scheduler
    plays their unfinished groups again (`roll.agentic.rollout.scheduler`)."""
    global _run_nodes
    _run_nodes = {r["node_id"] for r in rows if not r["role"].startswith("env_worker")}
    if "pending" in _run_nodes:  # a training or inference process not placed yet: any loss stops the run
        _run_nodes = None


def split_lost(lost: set[str], run_nodes: set[str] | None) -> tuple[set[str], set[str]]:
    """Lost node ids -> (those that stop the run, those that held env workers only)."""
    if run_nodes is None:
        return set(lost), set()
    return lost & run_nodes, lost - run_nodes


def _watch_nodes(period_s: float = 2.0) -> None:
    """On a cluster, losing a node of a training or inference process stops the run at once,
    whatever the driver waits on (a rollout whose inference worker was there would otherwise wait
    out its timeouts): the main thread gets a KeyboardInterrupt, which the CLI turns into one line
    (`lost_nodes`). Losing a node of env workers only is said in one line, and the run goes on."""
    let_go: set[str] = set()
    while (lost := _lost_ids()) is not None:  # None: Ray or its GCS is gone; the driver's calls say so
        fatal, env_only = split_lost(lost, _run_nodes)
        if fatal:
            _thread.interrupt_main()
            return
        for nid in sorted(env_only - let_go):
            _say(
                f"ray: lost node {_describe(nid)}, which held env workers only: Ray "
                "restarts them on the surviving nodes and their groups are played again; the run goes on"
            )
        let_go |= env_only
        time.sleep(period_s)


def joined() -> bool:
    """Whether this driver joined a cluster (`init_ray` with an address) rather than started Ray."""
    return _joined


def _join_failure(source: str, target: str, err: BaseException) -> str:
    chain = [err]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    text = " ".join(str(err).split())
    name = type(err).__name__
    if any(type(e).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(e) for e in chain):
        return (
            f"{source}={target}: Ray token authentication failed ({name}): the driver needs the cluster's "
            "token: RAY_AUTH_TOKEN_PATH=<the head's ~/.ray/auth_token> or RAY_AUTH_TOKEN, and RAY_AUTH_MODE=token"
        )
    return f"{source}={target}: cannot join the Ray cluster ({name}: {text[:300]})"


@contextmanager
def _loopback_node():
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextmanager
def _nothing():
    yield


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def actor_node(handle, timeout_s: float = 120.0) -> dict[str, str]:
    """The node an actor runs on, from Ray's GCS (no call into the actor, which may be busy):
    {"node_ip", "node_id"}; "pending" for both when it has not been placed within `timeout_s`.
    An actor still in its constructor (PENDING_CREATION, e.g. loading a model on a busy machine)
    already has its worker, so its node is known."""
    from ray._private import state

    actor_id = handle._actor_id.hex()

    def placed() -> dict[str, str] | None:
        info = state.actors(actor_id=actor_id) or {}
        address = info.get("Address") or {}
        node_id = address.get("NodeID") or ""
        if info.get("State") in ("ALIVE", "PENDING_CREATION") and node_id.strip("f0"):
            ip = address.get("IPAddress") or _nodes_at_start.get(node_id) or _node_ip(node_id)
            return {"node_ip": ip, "node_id": node_id}
        return None

    return wait_until(placed, timeout_s, interval_s=0.2) or {"node_ip": "pending", "node_id": "pending"}


def _node_ip(node_id: str) -> str:
    """A node's IP from Ray's node table (an actor in its constructor has a node but no IP yet)."""
    return next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "pending")


WORKER_KEYS = {"actor_train": "actor", "reference": "reference", "critic": "critic", "actor_infer": "inference"}
"""`build_workers`' key of each role."""


def placement_rows(plan, workers: dict, env_workers: dict[str, list]) -> list[dict]:
    """One row per process: every rank of every role (`plan`, a `DevicePlan`; `workers`,
    `build_workers`' dict) and every env worker (`env_workers`: manager name -> handles), with the
    node it landed on and its devices (its CUDA_VISIBLE_DEVICES, or "cpu")."""
    rows = []
    for role, placements in plan.processes.items():
        for placement, handle in zip(placements, process_handles(workers[WORKER_KEYS[role]]), strict=True):
            rows.append(
                {
                    "role": role,
                    "rank": placement.index,
                    **actor_node(handle),
                    "devices": placement.cuda_visible_devices or "cpu",
                }
            )
    for manager, handles in env_workers.items():
        rows += [
            {"role": f"env_worker:{manager}", "rank": i, **actor_node(h), "devices": "cpu"}
            for i, h in enumerate(handles)
        ]
    return rows


def write_placement(output_dir: str, rows: list[dict]) -> Path:
    """`output_dir/placement.json` (written whole, then renamed) and a short table on stderr."""
    path = Path(output_dir) / "placement.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"nodes": sorted({r["node_ip"] for r in rows}), "processes": rows}, indent=1))
    lines = [f"{'role':<18} {'rank':>4}  {'node ip':<15} {'node id':<12} devices"]
    lines += [
        f"{r['role']:<18} {r['rank']:>4}  {r['node_ip']:<15} {r['node_id'][:12]:<12} {r['devices']}" for r in rows
    ]
    _say("placement (" + str(path) + "):\n" + "\n".join(lines))
    return path
