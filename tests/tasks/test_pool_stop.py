"""``stop_ray``: a local Ray stops whole (its monitor killed first); a joined cluster is left running."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

#: A driver that starts a local Ray and stops it, then joins the cluster ``argv[1]`` and leaves it,
#: and says what each time left running.
STOP = """
import json, sys
from cli.runtime import settings
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

print(json.dumps([started_and_stopped(None), started_and_stopped(sys.argv[1])]))
"""


def test_a_local_ray_stops_whole_and_a_joined_cluster_is_left_running(local_ray):
    monitor = local_ray._private.worker._global_node.all_processes["monitor"][0].process
    done = subprocess.run([sys.executable, "-c", STOP, local_ray.get_runtime_context().gcs_address], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    local, joined = json.loads(done.stdout.strip().splitlines()[-1])
    # Its own Ray: every process it started is gone (the monitor first), and the driver can join another afterwards.
    assert {"raylet", "gcs_server", "monitor"} <= set(local["started"]), local
    assert local["alive"] == [] and local["initialized"] is False, local
    # A cluster it joined: it started nothing and disconnected; the cluster's processes run on.
    assert joined["started"] == {} and joined["initialized"] is False, joined
    assert monitor.poll() is None, "the cluster's monitor was stopped by a driver that only joined it"
    assert local_ray.get(local_ray.put(7)) == 7
