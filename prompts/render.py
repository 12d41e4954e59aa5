"""Render prompts for many agents at once.

Agents whose template variables are equal get the same prompt, so a template is
rendered once per distinct context (a handful for a million agents in round 1)
and the texts are joined back to agents by polars.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import polars as pl

from prompts.modes import TEMPLATE_DIR

#: Variables that differ between agents; everything else is shared by the whole shard.
AGENT_VARIABLES = ("persona", "own_guesses", "group")


def format_number(value: Any) -> str:
    """Numbers as people write them: 27 not 27.0, at most two decimals; text unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    text = f"{float(value):.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


@lru_cache(maxsize=None)
def _environment(directory: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([directory, str(TEMPLATE_DIR)]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )
    env.filters["num"] = format_number
    return env


def _sources(path: str) -> tuple[jinja2.Environment, str, list[tuple[str, str, jinja2.nodes.Template]]]:
    """The template's environment and name, and the template and each template it includes
    (at any depth), read now from disk as the environment's loader finds them: (file, text, parsed)."""
    file = Path(path) if Path(path).is_absolute() else TEMPLATE_DIR / path
    env = _environment(str(file.parent))
    found: list[tuple[str, str, jinja2.nodes.Template]] = []
    pending, seen = [file.name], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        source, filename, _ = env.loader.get_source(env, name)
        ast = env.parse(source)
        found.append((filename or name, source, ast))
        pending += [n for n in jinja2.meta.find_referenced_templates(ast) if n]
    return env, file.name, found


@lru_cache(maxsize=None)
def _template(path: str) -> tuple[jinja2.Template, frozenset[str]]:
    """The compiled template and the top-level variables it (and its includes) use."""
    env, name, found = _sources(path)
    names: set[str] = set()
    for _, _, ast in found:
        names |= jinja2.meta.find_undeclared_variables(ast)
    return env.get_template(name), frozenset(names)


def template_files(path: str) -> dict[str, str]:
    """The text of a template and of every template it includes, by file, as a render would
    read them now (not the compiled templates this process keeps)."""
    return {str(Path(filename).resolve()): source for filename, source, _ in _sources(path)[2]}


def template_variables(path: str) -> frozenset[str]:
    """The top-level variables a template uses (including its includes)."""
    return _template(path)[1]


def render(path: str, shared: dict[str, Any], agents: pl.DataFrame) -> list[str]:
    """Render one prompt per agent row.

    Args:
        path: a template file name in ``prompts/`` or an absolute path.
        shared: variables common to every agent (game, round, history…).
        agents: one row per agent; columns named after ``AGENT_VARIABLES`` (``persona``
            is a struct column) are passed to the template when it uses them.
    """
    keyed, keys, texts = _render_keyed(path, shared, agents)
    if keyed is None:
        return texts * agents.height
    lookup = pl.DataFrame({"_key": keys, "_text": texts})
    return keyed.select("_key").join(lookup, on="_key", how="left", maintain_order="left")["_text"].to_list()


def render_distinct(path: str, shared: dict[str, Any], agents: pl.DataFrame) -> list[str]:
    """The distinct prompts ``render`` gives these agents, in the order they first appear (each
    rendered once, without a list of one prompt per agent)."""
    return list(dict.fromkeys(_render_keyed(path, shared, agents)[2]))


def distinct_agents(path: str, agents: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``agents`` (template variables, as ``render`` takes them) that give the
    distinct prompts of ``path``: ``row``, the first row of each, in order, and ``agents``, how
    many rows share its prompt (one row of all when the template uses no agent variable).
    Nothing is rendered."""
    keys = prompt_keys(path, agents)
    if keys is None:
        return pl.DataFrame({"row": [0], "agents": [agents.height]}, schema={"row": pl.UInt32, "agents": pl.UInt32})
    keyed = pl.DataFrame({"_key": keys}).with_row_index("row")
    return keyed.group_by("_key", maintain_order=True).agg(pl.col("row").first(), pl.len().alias("agents")).drop("_key")


def prompt_keys(path: str, agents: pl.DataFrame) -> pl.Series | None:
    """Each row's prompt key (a hash of the agent variables of ``path`` it holds): rows with equal
    keys get the same prompt. None when the template uses no agent variable (one prompt for all).
    Nothing is rendered."""
    _, columns = _keyed_by(path, agents)
    return agents.select(_prompt_key(columns))[:, 0] if columns else None


def _keyed_by(path: str, agents: pl.DataFrame) -> tuple[jinja2.Template, list[str]]:
    """The template and the agent variables it uses that ``agents`` holds: agents equal in
    them share a prompt."""
    template, used = _template(path)
    return template, [c for c in AGENT_VARIABLES if c in used and c in agents.columns]


def _prompt_key(columns: list[str]) -> pl.Expr:
    """One key per distinct prompt: a hash of the agent variables it is rendered from."""
    return pl.struct(columns).hash(seed=0)


def _render_keyed(path: str, shared: dict[str, Any], agents: pl.DataFrame) -> tuple[pl.DataFrame | None, pl.Series | None, list[str]]:
    """The agents' template variables keyed by a hash of them (None if the template uses none),
    the distinct keys, and the text of each."""
    template, columns = _keyed_by(path, agents)
    if not columns:
        return None, None, [template.render(**shared)]
    keyed = agents.select(columns).with_columns(_key=_prompt_key(columns))
    distinct = keyed.unique(subset="_key", maintain_order=True)
    texts = [template.render(**shared, **row) for row in distinct.select(columns).iter_rows(named=True)]
    return keyed, distinct["_key"], texts
