"""Fault 8 (exposure): servers keynes starts listen on 127.0.0.1 only.

On main today: the Ray dashboard (``workers.dashboard: true``) and Prefect's temporary
API server that a flow starts when no ``PREFECT_API_URL`` is set. Each is started in a
fresh subprocess, which reports the addresses its servers listen on (psutil).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = r"""
import json, os, sys, time
import psutil

def listening(pids):
    found = set()
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            found.add(c.laddr.ip)
    return sorted(found)

def family():
    me = psutil.Process()
    return {me.pid} | {p.pid for p in me.children(recursive=True)}

which = sys.argv[1]
if which == "ray-dashboard":
    from tasks.pool import ensure_ray
    info = ensure_ray(dashboard=True, num_cpus=1)
    port = int(info["dashboard_url"].rsplit(":", 1)[1])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        hosts = sorted({c.laddr.ip for c in psutil.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN and c.laddr.port == port})
        if hosts:
            break
        time.sleep(0.5)
    print(json.dumps({"url": info["dashboard_url"], "hosts": hosts}))
    import ray; ray.shutdown()
else:
    from prefect import flow
    seen = {}

    @flow
    def probe():
        seen["hosts"] = listening(family())

    probe()
    print(json.dumps(seen))
"""


def run(which: str, home) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    env.update(PREFECT_HOME=str(home), RAY_ENABLE_UV_RUN_RUNTIME_ENV="0",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, which], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_ray_dashboard_listens_on_localhost_only(prefect_home):
    result = run("ray-dashboard", prefect_home)
    assert result["url"].startswith("127.0.0.1:")
    assert result["hosts"] == ["127.0.0.1"], result


@pytest.mark.slow
def test_prefects_temporary_api_listens_on_localhost_only(prefect_home):
    result = run("prefect", prefect_home)
    assert result["hosts"] and set(result["hosts"]) <= {"127.0.0.1"}, result
