"""``keynes personas``: sample (and store) a population, with expected against sampled shares."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from cli.common import console, fail, out


def personas(
    spec: Annotated[Path, typer.Argument(help="A population spec (YAML); names are also looked up in populations/.")],
    n: Annotated[int, typer.Option("--n", help="How many personas to sample.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="The seed every draw derives from.")] = 0,
    db: Annotated[Optional[Path], typer.Option("--db", help="Store the personas in this DuckDB warehouse.")] = None,
    backstories: Annotated[bool, typer.Option("--backstories", help="Write a backstory for every persona with an LLM (needs --db: they are cached there).")] = False,
    engine: Annotated[str, typer.Option("--engine", help="The engine kind that writes backstories (llamacpp: Gemma 3 270M).")] = "llamacpp",
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Token budget of one backstory.")] = 96,
    actors: Annotated[int, typer.Option("--actors", help="Ray actors that write backstories.")] = 1,
    show: Annotated[int, typer.Option("--show", help="Also print the first N personas.")] = 0,
) -> None:
    """Sample a population (and store it) and print expected vs sampled shares per attribute.

    Example: keynes personas populations/education.yaml --n 1000 --seed 7 --db keynes.duckdb
    """
    from populations.spec import SpecError, load_spec
    from populations.summary import share_report

    try:
        population = load_spec(spec)
    except SpecError as exc:
        fail(str(exc))
    if n <= 0:
        fail(f"--n: population size must be positive, got {n}")
    if backstories and db is None:
        fail("--backstories: needs --db (backstories are cached in the warehouse)")
    if db is not None and not db.parent.is_dir():
        fail(f"--db: directory {str(db.parent)!r} of {str(db)!r} does not exist")
    from populations.backstories import BackstoryConfig
    from tasks.personas import make_personas, population_id
    from warehouse.store import Warehouse, WarehouseError

    settings = None
    if backstories:
        from pydantic import ValidationError

        try:
            settings = BackstoryConfig(enabled=True, engine={"kind": engine}, max_tokens=max_tokens)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            option = "--max-tokens" if error["loc"] and error["loc"][0] == "max_tokens" else "--engine"
            fail(f"{option}: {error['msg'].removeprefix('Value error, ')}")
    warehouse = Warehouse(db) if db is not None else None
    if backstories:  # written on Ray actors: `keynes up`'s Ray, if it runs
        from cli.common import warm_stack

        stack = warm_stack(None)
        if stack is not None:
            from cli.runtime.stack import join

            join(stack, lambda line: console.print(line, highlight=False))
    try:
        frame, counts = make_personas(population, n, seed, warehouse, settings, actors)
        stored = warehouse.write_personas(population_id(population, n, seed, settings), frame) if warehouse else 0
    except (WarehouseError, ValueError) as exc:
        fail(str(exc).splitlines()[0])
    finally:
        from tasks.pool import stop_ray

        stop_ray()
    report = share_report(population, frame)
    table = Table(show_header=True, header_style="bold", title=f"{population.name}: {n:,} personas ({population.sampling}, seed {seed})")
    for column in ("attribute", "value", "expected", "sampled", "count"):
        table.add_column(column, justify="right" if column in ("expected", "sampled", "count") else "left")
    for row in report.iter_rows(named=True):
        expected = "" if row["expected"] is None else f"{row['expected']:.4f}"
        table.add_row(row["attribute"], row["value"], expected, f"{row['sampled']:.4f}", f"{row['count']:,}")
    out.print(table)
    if show:
        out.print(frame.head(show))
    if counts is not None:
        console.print(f"backstories: {counts.generated} generated, {counts.reused} reused, {counts.failed} failed", highlight=False)
    if warehouse is not None:
        pid = population_id(population, n, seed, settings)
        what = f"stored {stored:,} personas" if stored else "already stored"
        console.print(f"{what} as {pid!r} in {db}. Query them: keynes sql --db {shlex.quote(str(db))} "
                      f"\"select * from personas where experiment_id = '{pid}'\"", highlight=False, soft_wrap=True)
