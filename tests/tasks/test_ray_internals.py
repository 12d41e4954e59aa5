"""tasks/ray_internals.py on the real Ray: each use of Ray's private members still does what
``tasks.pool`` relies on. An upgrade that renames or changes one fails here, by name, before a
SIGTERM during ``ray.init`` is lost or ``stop_ray`` waits on the monitor again."""

from __future__ import annotations

import inspect
import signal

import psutil
import pytest

from tasks import ray_internals

pytestmark = pytest.mark.quick


def test_ray_init_sets_its_sigterm_handler_through_the_function_kept_out():
    import ray._private.utils as ray_utils
    import ray._private.worker as ray_worker

    # ray.init looks the function up on its module at each call, which is what lets it be replaced.
    assert "ray._private.utils.set_sigterm_handler(sigterm_handler)" in inspect.getsource(ray_worker.init)
    before = signal.getsignal(signal.SIGTERM)

    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    try:
        with ray_internals.sigterm_handler_kept():
            ray_utils.set_sigterm_handler(mine)  # as ray.init calls it
            assert signal.getsignal(signal.SIGTERM) is before
        ray_utils.set_sigterm_handler(mine)  # Ray's own again: it installs the handler
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_local_rays_monitor_is_on_its_record(local_ray):
    """The session's local Ray started in this process: its node's record holds one live monitor."""
    from ray._private import ray_constants
    from ray._private.worker import _global_node

    infos = _global_node.all_processes[ray_constants.PROCESS_TYPE_MONITOR]
    found = ray_internals.monitor_processes()
    assert [p.pid for p in found] == [info.process.pid for info in infos] and len(found) == 1
    assert found[0].poll() is None
    assert "monitor" in " ".join(psutil.Process(found[0].pid).cmdline())
