"""``keynes bench``: benchmarks that print comparable figures (benchmarks/ in the source tree)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from cli.common import fail


def bench_scale(ctx: typer.Context) -> None:
    """The paper's million-agent benchmark through the real flow; options as benchmarks/scale.py --help.

    Example: keynes bench scale --sizes 10000,100000
    """
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "scale.py"
    if not script.exists():
        fail(f"{script}: not found (benchmarks run from a keynes source checkout)")
    spec = importlib.util.spec_from_file_location("keynes_bench_scale", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    module.main(list(ctx.args))
