"""``keynes up``: a local Ray and Prefect API kept warm between commands (``keynes down`` stops them)."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from cli.common import console, fail


def up(
    num_cpus: Annotated[Optional[int], typer.Option("--num-cpus", help="CPUs Ray's head offers its actors (default: the machine's).")] = None,
) -> None:
    """Start a local Ray head and a Prefect API server, detached, on 127.0.0.1 only, and keep them
    running: `keynes run` (and `keynes personas --backstories`) join them instead of starting their own.

    Example: keynes up && keynes run experiments/quickstart.yaml && keynes down
    """
    from cli.runtime.stack import START_TIMEOUT_S, StackError, read, record_path
    from cli.runtime.stack import down as stack_down
    from cli.runtime.stack import up as stack_up

    stack = read()
    if stack is not None and not stack.processes and time.time() - stack.created < START_TIMEOUT_S:
        fail(f"another keynes up is starting the warm stack ({record_path()}); wait for it, or stop it: keynes down")
    if stack is not None:
        gone, foreign = stack.gone(), stack.foreign()
        if not gone and not foreign:
            console.print(f"the warm stack is up already: Ray at {stack.ray_address}, Prefect API at {stack.prefect_url}; "
                          "stop it with: keynes down", highlight=False, soft_wrap=True)
            return
        if foreign and not gone:
            fail(f"a warm stack of another keynes is up ({foreign}); stop it first: keynes down")
        for line in stack_down():
            console.print(line, highlight=False, soft_wrap=True)
        console.print(f"the warm stack in {record_path()} was stale ({', '.join(gone)} ended): cleared", highlight=False, soft_wrap=True)
    elif record_path().exists():  # a record this keynes cannot read: what it marked is ended all the same
        stack_down()
    console.print("starting a local Ray head and a Prefect API server (127.0.0.1 only)...", highlight=False)
    try:
        stack = stack_up(num_cpus, say=lambda line: console.print(line, highlight=False, soft_wrap=True))
    except StackError as exc:
        fail(str(exc))
    console.print(f"Ray: {stack.ray_address} ({stack.num_cpus} CPUs, Ray {stack.ray}; its files in {stack.ray_temp_dir})", highlight=False, soft_wrap=True)
    console.print(f"Prefect API: {stack.prefect_url} (UI: {stack.ui_url})", highlight=False, soft_wrap=True)
    console.print(f"recorded in {record_path()}: keynes run and keynes personas --backstories join them; stop them with: keynes down",
                  highlight=False, soft_wrap=True)

