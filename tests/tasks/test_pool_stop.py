"""``stop_ray``: a local Ray stops whole (its monitor killed first); a joined cluster is left running."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

#: A driver that starts Ray (its own, or joins ``argv[1]``), stops it, and says what is left.
STOP = """
import json, sys
from flows import settings
settings.apply()
import psutil, ray
from tasks.pool import ensure_ray, stop_ray

def started_and_stopped(address):
    ensure_ray(address=address, num_cpus=None if address else 1)
    node = ray._private.worker._global_node
    pids = {kind: [info.process.pid for info in infos] for kind, infos in node.all_processes.items()}
    stop_ray()
    alive = [pid for group in pids.values() for pid in group
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    return {"started": pids, "alive": alive, "initialized": ray.is_initialized()}

address = sys.argv[1] if len(sys.argv) > 1 else None
print(json.dumps([started_and_stopped(address) for _ in range(1 if address else 2)]))
"""


def _stop(*args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", STOP, *args], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_local_ray_stops_whole_and_starts_again():
    for run in _stop():  # twice in one driver: stopping leaves nothing that keeps the next start from working
        assert {"raylet", "gcs_server", "monitor"} <= set(run["started"]), run
        assert run["alive"] == [] and run["initialized"] is False, run


def test_a_driver_that_joined_a_cluster_leaves_its_processes_running(local_ray):
    monitor = local_ray._private.worker._global_node.all_processes["monitor"][0].process
    [run] = _stop(local_ray.get_runtime_context().gcs_address)
    assert run["started"] == {} and run["initialized"] is False, run  # it started nothing, and disconnected
    assert monitor.poll() is None, "the cluster's monitor was stopped by a driver that only joined it"
    assert local_ray.get(local_ray.put(7)) == 7
