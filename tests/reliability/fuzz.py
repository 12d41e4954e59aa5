"""Generated bad input for the fuzz tests: configs, YAML text and ``--set`` overrides drawn
from the config models themselves, and the check every refusal must pass.

``configs()`` walks ``ExperimentConfig``'s fields (their types and bounds) and fills each
with a value that fits, or with a wild one: a wrong type, an out-of-range, huge or negative
number, an empty or unicode string, deep nesting; every mapping may carry unknown keys.
``refusal`` is the in-process path of ``keynes run`` (``load_config``, the arms, the prompt
formats); ``names_a_field`` says whether a refusal's one line starts with a field path the
config model has (or the offending key, or the file, or the ``--set`` item).
"""

from __future__ import annotations

import json
import math
import os
import re
import types
import typing
from typing import Any

import annotated_types as at
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import engines
from design.config import ExperimentConfig
from engines.mixture import MixtureComponent, MixtureSpec

# Build a regex strategy once at import, on a shallow stack: hypothesis imports its regex module
# the first time one is drawn, and that import (its source compiled under pytest's assertion
# rewriting) deep inside a strategy's validation failed once with CPython 3.11's "SystemError:
# AST constructor recursion depth mismatch".
st.from_regex(r"a", fullmatch=True).validate()

# The suite's runs are reproducible: each test draws the same examples every time (derandomize),
# without a local database of past failures (found ones are kept as explicit examples in the
# tests). KEYNES_FUZZ=explore draws new ones on every run (docs/development.md).
# No "explain" phase: it traces every line the failing example runs, which takes minutes for
# the deeply nested inputs.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
settings.register_profile("default", derandomize=True, database=None, deadline=None, print_blob=True, phases=PHASES)
settings.register_profile("explore", derandomize=False, deadline=None, print_blob=True, phases=PHASES,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("KEYNES_FUZZ", "default"))

#: Text a user could type by mistake: empty, blank, unicode, control and markup characters.
TEXT = st.one_of(
    st.sampled_from(["", " ", "\t", "ä", "名前", "🎲", "a\nb", "[/]", "[bold]x", "\x00", "null", "~", ".", "..", "/"]),
    st.text(max_size=12),
)
NUMBERS = st.one_of(
    st.integers(-3, 3), st.sampled_from([-(2**63), 2**63, 2**64, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, 1e300, -1.5]),
)
#: Any wrong value: scalars of every type, short lists, mappings, nesting up to a few levels.
WILD = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)

#: Fractions as users write them, right and wrong (game.ratio, arms.games.N.ratio).
FRACTIONS = st.one_of(
    st.sampled_from(["2/3", "1/2", "51/100", "0.5", "1", 0.5, 1, 2, "1/1", " 2/3 ", "+2/3", "4/6"]),
    st.sampled_from(["2//3", "1/0", "0/0", "-1/2", "nan", "inf", "-inf", "1e400", "1e-400", "2/3/4", "", " ", "½",
                     "٢/٣", "1_0/3", "2/-3", "0x10", "1e5/1e-5", "9" * 5000, "1/" + "9" * 400, "2 / 3", True]),
    st.builds(lambda a, b: f"{a}/{b}", st.integers(-5, 10**20), st.integers(-5, 10**20)),
    st.decimals(allow_nan=True, allow_infinity=True).map(str),
)
TEMPLATES = st.sampled_from(["cot.j2", "basic.j2", "nothere.j2", "/nonexistent/x.j2", "", "."])

#: Values that fit fields a type alone says little about, by dotted path ("N": any list index).
FITTING: dict[str, st.SearchStrategy] = {
    "name": st.one_of(st.sampled_from(["fuzz", "exp-1", "a_b"]), TEXT),
    "population.spec": st.sampled_from(["education.yaml", "education", "occupation.yaml", "adults", "nowhere.yaml", "", "a" * 300]),
    "population.sampling": st.sampled_from(["quota", "iid", "QUOTA"]),
    "population.attributes": st.dictionaries(
        st.sampled_from(["education", "gender", ""]),
        st.one_of(st.dictionaries(TEXT, st.floats(-1, 2) | st.just(0.5), min_size=1, max_size=3), WILD), max_size=2,
    ),
    "population.backstories.engine": st.one_of(st.fixed_dictionaries({"kind": st.sampled_from(["simulated", "llamacpp", "nope"])}), WILD),
    "population.backstories.template": TEMPLATES,
    "game.ratio": FRACTIONS,
    "arms.games.N.ratio": FRACTIONS,
    "arms.prompts.N": st.one_of(st.sampled_from(["basic", "cot", "persona", "background", "population", "nope", "cot.j2", "missing.j2"]),
                                st.fixed_dictionaries({"name": TEXT, "template": TEMPLATES})),
    "groups.by": st.sampled_from(["education", "gender", "nope", ""]),
    "schedule.cron": st.sampled_from(["0 * * * *", "*/5 * * * * *", "* *", "@hourly", "61 * * * *"]),
    "schedule.timezone": st.sampled_from(["UTC", "Europe/Berlin", "Mars/Olympus", "../etc", "a" * 300]),
    "workers.ray_address": st.sampled_from(["auto", "ray://127.0.0.1:10001"]),
    "model": st.sampled_from(["gemma-3-270m", "smollm2-135m-instruct", "/nonexistent/x.gguf", "x", "a" * 300]),
    "base_url": st.sampled_from(["http://127.0.0.1:8000/v1", "not a url", ""]),
}


def _bounds(metadata: list) -> tuple[float | None, float | None]:
    low = high = None
    for m in metadata:
        if isinstance(m, at.Gt | at.Ge):
            low = m.gt if isinstance(m, at.Gt) else m.ge
        if isinstance(m, at.Lt | at.Le):
            high = m.lt if isinstance(m, at.Lt) else m.le
    return low, high


def _numbers(kind: type, metadata: list) -> st.SearchStrategy:
    """Numbers near and across a field's bounds, and huge ones."""
    low, high = _bounds(metadata)
    edges = [e for b in (low, high) if b is not None for e in (b - 1, b, b + 1)]
    if kind is int:
        base = st.integers(int(low or 0), int(low or 0) + 20)
        return st.one_of(base, st.sampled_from([int(e) for e in edges] or [0]), st.integers(-(2**70), 2**70))
    base = st.floats(low if low is not None else -100, high if high is not None else 1000, allow_nan=False)
    return st.one_of(base, st.sampled_from(edges or [0.0]), st.floats())


def _key(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _fitting(annotation: Any, metadata: list, path: tuple[str, ...], wild: bool) -> st.SearchStrategy:
    """Values of ``annotation`` (the field at ``path``), mostly fitting it."""
    for key in (_key(path), path[-1] if path else ""):
        if key in FITTING:
            return FITTING[key]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _fitting(args[0], [*metadata, *args[1:]], path, wild)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_value(a, metadata, path, wild) for a in args])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (list, tuple):
        item = args[0] if args else Any
        return st.lists(_value(item, [], (*path, "N"), wild), min_size=0, max_size=3)
    if origin is dict:
        return st.dictionaries(TEXT, WILD, max_size=2)
    if annotation is type(None):
        return st.none()
    if annotation is bool:
        return st.booleans()
    if annotation in (int, float):
        return _numbers(annotation, metadata)
    if annotation is str:
        return TEXT
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_values(annotation, path, wild)
    return WILD


def _value(annotation: Any, metadata: list, path: tuple[str, ...], wild: bool) -> st.SearchStrategy:
    fitting = _fitting(annotation, metadata, path, wild)
    return _mostly(fitting) if wild else fitting


def value_for(field: tuple) -> st.SearchStrategy:
    """Values for one of ``field_paths()``: mostly fitting, sometimes wild."""
    path, annotation, metadata, _ = field
    return _value(annotation, metadata, tuple("N" if p.isdigit() else p for p in path), True)


@st.composite
def _mostly(draw, fitting: st.SearchStrategy) -> Any:
    """A value of ``fitting``, or one time in twelve a wild one: a config holds a few, or none."""
    return draw(WILD) if draw(st.integers(0, 11)) == 0 else draw(fitting)


@st.composite
def _unknown_keys(draw, keys: list[str]) -> dict:
    """Keys the model does not have: near misses of its own, and any text."""
    near = [k + "s" for k in keys] + [k[:-1] for k in keys if len(k) > 1] + [k.upper() for k in keys] + [k.replace("_", "-") for k in keys if "_" in k]
    names = draw(st.lists(st.one_of(st.sampled_from(near or ["x"]), TEXT), min_size=1, max_size=2))
    return {name: draw(WILD) for name in names if name not in keys}


@st.composite
def _with_unknown_keys(draw, mappings: st.SearchStrategy, extra: st.SearchStrategy) -> dict:
    """A mapping of ``mappings``; one time in twelve with unknown keys too."""
    data = draw(mappings)
    return {**data, **draw(extra)} if draw(st.integers(0, 11)) == 0 else data


def model_values(model: type[BaseModel], path: tuple[str, ...] = (), wild: bool = True) -> st.SearchStrategy:
    """Mappings for ``model``: any subset of its fields, each mostly fitting; sometimes unknown keys."""
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    engine_kind = typing.get_args(fields["kind"].annotation) if "kind" in fields else ()
    required = {key: st.just(engine_kind[0]) if key == "kind" and engine_kind else _value(f.annotation, f.metadata, (*path, key), wild)
                for key, f in fields.items() if f.is_required() or key == "kind"}
    optional = {key: _value(f.annotation, f.metadata, (*path, key), wild) for key, f in fields.items() if key not in required}
    mappings = st.fixed_dictionaries(required, optional=optional)
    if not wild:
        return mappings
    extra = _unknown_keys(list(fields))
    return _with_unknown_keys(mappings, extra)


def configs(wild: bool = True) -> st.SearchStrategy:
    """Whole configs (mappings), from ``ExperimentConfig``'s fields."""
    built = model_values(ExperimentConfig, (), wild)
    return st.deferred(lambda: built)  # a short repr: the full one is megabytes long


#: Engine config models by kind, for the sections that hold an engine.
def _engine_kinds() -> dict[str, type[BaseModel]]:
    return {**{k: engines.spec_class(k) for k in engines.available()}, "mixture": MixtureSpec}


def field_paths(model: type[BaseModel] = ExperimentConfig, prefix: tuple[str, ...] = (), setup: tuple = ()) -> list[tuple]:
    """Every field of the config model, nested ones and each engine kind's included:
    ``(path, annotation, metadata, setup)``, where ``setup`` holds the ``(path, value)`` pairs
    the field needs around it (its engine's ``kind``). List items are item 0."""
    out = []
    for name, f in model.model_fields.items():
        path = (*prefix, f.alias or name)
        out.append((path, f.annotation, f.metadata, setup))
        if path[-1] == "engine" or path[-2:] == ("engines", "0") or path[-1] == "engines":
            slot = path if path[-1] == "engine" else (*path, "0")
            for kind, spec in _engine_kinds().items():
                if kind == "mixture" and "components" in prefix:
                    continue  # a mixture holds no mixture
                out += field_paths(spec, slot, (*setup, ((*slot, "kind"), kind)))
            continue
        for inner in _models(f.annotation):
            if inner not in (MixtureSpec, *_engine_kinds().values()):
                item = (*path, "0") if _sequence(f.annotation) else path
                out += field_paths(inner, item, setup)
    return [p for p in out if p[0][-1] != "kind" or p[2]]


def put(data: dict, path: tuple[str, ...], value: Any) -> dict:
    """Set ``path`` in nested mappings and lists ("0": a list item), making what is missing."""
    node: Any = data
    for part, nxt in zip(path, path[1:]):
        want = list if nxt.isdigit() else dict
        node = _slot(node, part, want)
    if isinstance(node, list):
        _slot(node, path[-1], dict)
        node[int(path[-1])] = value
    else:
        node[path[-1]] = value
    return data


def _slot(node: Any, part: str, want: type) -> Any:
    """The ``want`` (a list or mapping) at ``part`` of ``node``, made when missing or of another type."""
    key: Any = part
    if isinstance(node, list):
        key = int(part)
        node.extend({} for _ in range(key + 1 - len(node)))
    if not isinstance(node[key] if isinstance(node, list) else node.get(key), want):
        node[key] = want()
    return node[key]


def one_field_changed(base: dict, paths: list[tuple], wild: bool = True) -> st.SearchStrategy:
    """``base`` with one to three fields of the model (any depth) set to a drawn value."""
    values = [_value(annotation, metadata, tuple("N" if p.isdigit() else p for p in path), wild)
              for path, annotation, metadata, _ in paths]

    @st.composite
    def changed(draw) -> dict:
        data = json.loads(json.dumps(base))
        for i in draw(st.lists(st.integers(0, len(paths) - 1), min_size=1, max_size=3)):
            path, _, _, setup = paths[i]
            for where, value in setup:
                put(data, where, value)
            put(data, path, draw(values[i]))
        return data

    built = changed()
    return st.deferred(lambda: built)


# --------------------------------------------------------------------------- the check
def refusal(source: Any, overrides: list[str] | tuple[str, ...] = ()) -> str | None:
    """What ``keynes run`` does before it opens the warehouse: the config's one-line refusal,
    or None when it would run. Any other exception is a traceback (the test fails)."""
    from design.config import ConfigError
    from design.loading import load_config
    from flows.experiment import check_prompting

    try:
        cfg = load_config(source, list(overrides))
        arms = cfg.arms_list()
        check_prompting(cfg, arms)
    except ConfigError as exc:
        return str(exc)
    assert cfg.experiment_id and len(arms) >= 1
    for arm in arms:  # what a run computes and stores from each rule
        assert math.isfinite(float(arm.rule.fraction)) and math.isfinite(arm.rule.equilibrium)
        assert arm.rule.low <= arm.rule.target(arm.rule.high) <= arm.rule.high
    # A valid config validates again from its own dump, as the same experiment.
    assert load_config(cfg.model_dump(mode="json")).experiment_id == cfg.experiment_id
    return None


def _model_field(model: Any, part: str) -> Any:
    """The annotation of field ``part`` of ``model`` (any of a union's models), or None."""
    for candidate in _models(model):
        for name, f in candidate.model_fields.items():
            if part in (name, f.alias):
                return f.annotation
    return None


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _open_ended(annotation: Any) -> bool:
    """A field whose inside the model does not spell out (a mapping, Any)."""
    return annotation is Any or typing.get_origin(annotation) is dict or any(_open_ended(a) for a in typing.get_args(annotation)
                                                                             if typing.get_origin(annotation) is not typing.Literal)


def _sequence(annotation: Any) -> bool:
    """A list or tuple field (or a union holding one)."""
    return typing.get_origin(annotation) in (list, tuple) or any(_sequence(a) for a in typing.get_args(annotation))


def field_exists(path: list[str]) -> bool:
    """Whether a dotted path (list indices as numbers) names a field of the config model."""
    node: Any = ExperimentConfig
    engine_models = [engines.spec_class(k) for k in engines.available()] + [MixtureSpec, MixtureComponent]
    for i, part in enumerate(path):
        if _open_ended(node) and not _models(node):
            return True
        if part.isdigit() and _sequence(node):
            node = next((typing.get_args(a)[0] for a in [node, *typing.get_args(node)] if typing.get_origin(a) in (list, tuple)), Any)
            continue
        if path[i - 1:i] == ["engine"] and part in engines.available() + ["mixture"]:
            continue
        found = _model_field(node, part)
        if found is None and path[:1] == ["population"] and path[1:2] == ["backstories"] and path[2:3] == ["engine"]:
            found = _model_field(typing.Union[tuple(engine_models)], part)
        if found is None:
            return False
        node = found
    return True


def _split(head: str) -> list[str]:
    """A dotted path's parts; a quoted part (a key with dots or unprintable characters) is one."""
    return [p.strip("'\"") if p[:1] in "'\"" else p for p in re.findall(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^.]+", head)]


def names_a_field(message: str, origin: str | None = None) -> bool:
    """Whether a refusal starts with what it is about: a field path of the config model, an
    unknown key under one, the config file (YAML problems) or the ``--set`` item."""
    head = message.split(": ", 1)[0]
    if origin is not None and head == origin or head.startswith(("--set ", "overrides ")):
        return True
    path = _split(head)
    if field_exists(path):
        return True
    if "given twice" in message:  # the key where the file has it (possibly under an unknown key)
        return True
    return ("unknown key" in message or "no item" in message) and (len(path) == 1 or field_exists(path[:-1]))


def one_line(message: str) -> bool:
    """A message of one line, not blank."""
    return bool(message.strip()) and "\n" not in message and "\r" not in message

