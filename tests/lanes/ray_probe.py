"""Run by tests/pipeline/test_ray_local.py in a fresh process: start or join Ray as the pipeline
does (`init_ray(None)`), print one JSON line (joined?, GCS address, the listening
TCP sockets of this process and every process it started), then, with `hold`, keep Ray up until
stdin closes (only then is an actor started: its worker's sockets are listed too)."""

import json
import sys

import psutil
import ray

from roll.pipeline.setup.builders import init_ray


@ray.remote(num_cpus=0)
class Probe:
    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


def listening_sockets() -> list[list]:
    me = psutil.Process()
    found = []
    for proc in [me, *me.children(recursive=True)]:  # GCS, raylet, agents, workers: all started here
        try:
            found += [
                [proc.name(), c.laddr.ip, c.laddr.port]
                for c in proc.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            ]
        except psutil.Error:
            continue
    return found


if __name__ == "__main__":
    joined = init_ray(None)
    if "hold" in sys.argv[1:]:  # the instance whose sockets are checked: a worker process is up too
        ray.get(Probe.remote().node_id.remote())
    print(
        json.dumps(
            {
                "joined": joined,
                "gcs": ray.get_runtime_context().gcs_address,
                "listening": listening_sockets(),
                "task_events_in_gcs": ray._raylet.Config.task_events_max_num_task_in_gcs(),
            }
        ),
        flush=True,
    )
    if sys.argv[1:] == ["hold"]:
        sys.stdin.read()
