"""Every use of Ray's private members, in one place.

keynes reaches under Ray's public API twice, both in ``tasks.pool``: ``ray.init`` must not
replace the driver's SIGTERM handler while it starts Ray, and ``stop_ray`` kills a local Ray's
autoscaler monitor before ``ray.shutdown`` (a second sooner). Each function here names the
private member it uses; tests/tasks/test_ray_internals.py checks each on the real Ray, so an
upgrade that renames or changes one fails there, by name.
"""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def sigterm_handler_kept() -> Iterator[None]:
    """While open, Ray installs no SIGTERM handler of its own (``ray.init`` makes SIGTERM a bare
    ``sys.exit`` in the driver): ``ray._private.utils.set_sigterm_handler``, which ``ray.init``
    calls through its module, is a no-op meanwhile."""
    import ray._private.utils as ray_utils

    install = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install


def monitor_processes() -> list[subprocess.Popen]:
    """The autoscaler monitor processes this driver's Ray started (none when it joined a cluster,
    or another Ray keeps other records): ``ray._private.worker._global_node.all_processes``, keyed
    by ``ray._private.ray_constants.PROCESS_TYPE_MONITOR``, each a ``ProcessInfo`` with its ``process``."""
    try:
        from ray._private import ray_constants
        from ray._private.worker import _global_node
    except ImportError:
        return []
    if _global_node is None:
        return []
    infos = getattr(_global_node, "all_processes", {}).get(getattr(ray_constants, "PROCESS_TYPE_MONITOR", "monitor"), [])
    return [info.process for info in infos if getattr(info, "process", None) is not None]
