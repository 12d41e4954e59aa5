"""Loading an experiment config: YAML in, ``--set`` overrides applied, one clear line per error.

A validation error becomes ``field.path: what is wrong`` with the bad value; an unknown
key gets the nearest known key as a suggestion (from the engine's own fields for engine
settings).
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

import engines
from engines.mixture import MixtureSpec
from flows.config import ConfigError, ExperimentConfig

#: Configs parsed in this process, by their text and overrides: a run parses its config once
#: (the CLI, the flow run's name and the flow read the same file with the same overrides). A
#: config is frozen, so sharing it is safe; a changed file is a new key.
_PARSED: dict[str, ExperimentConfig] = {}
_PARSED_MAX = 16


def load_config(source: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read a YAML file (or a mapping), apply ``dotted.key=value`` overrides, validate.

    Raises:
        ConfigError: one line naming the field path and the bad value.
    """
    if isinstance(source, dict):
        text = json.dumps(source)  # read back below: the same plain data, in the same order
        origin = "config"
    else:
        path = Path(source)
        origin = str(path)
        if not path.exists():
            raise ConfigError(f"{origin}: no such config file")
        text = path.read_text()
    key = json.dumps([origin, text, list(overrides)])
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = _parse(origin, json.loads(text) if isinstance(source, dict) else _yaml(origin, text), overrides)
    return _PARSED[key]


def _yaml(origin: str, text: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{origin}: {where}invalid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of settings, got {type(data).__name__}")
    return data


def _parse(origin: str, data: dict, overrides: list[str] | tuple[str, ...]) -> ExperimentConfig:
    for item in overrides:
        apply_override(data, item)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, data)) from None


def apply_override(data: dict, item: str) -> None:
    """Set ``dotted.key=value`` in a nested mapping (list items by index); the value is YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: no item {part!r} in a list of {len(node)}")
            node = node[int(part)]
            continue
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        node = nxt
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"{key}: no item {last!r} in a list of {len(node)}")
        node[int(last)] = value
    else:
        node[last] = value


def format_error(exc: ValidationError, data: Any = None) -> str:
    """The first validation error as ``field.path: message`` with the bad value."""
    error = exc.errors(include_url=False)[0]
    loc = [str(p) for p in error["loc"]]
    # A discriminated union puts the engine kind in the path: drop it.
    kinds = [*engines.available(), "mixture"]
    loc = [p for i, p in enumerate(loc) if not (i > 0 and (loc[i - 1].isdigit() or loc[i - 1] == "engine") and p in kinds)]
    loc = [p for i, p in enumerate(loc) if not (i > 0 and loc[i - 1].isdigit() and p in ("builtin", "custom"))]
    path = ".".join(loc) or "config"
    value = error.get("input")
    kind = error["type"]
    message = error["msg"]
    # A check across fields (a model validator) names its own path: "groups.by: ...".
    if not loc and kind == "value_error" and re.match(r"^[\w.]+: ", message.removeprefix("Value error, ")):
        return message.removeprefix("Value error, ")
    if kind == "extra_forbidden":
        parent_model = _engine_model_at(data, error["loc"][:-1]) or _model_at(loc[:-1])
        hint = ""
        if parent_model is not None:
            keys = [field.alias or name for name, field in parent_model.model_fields.items()]
            close = difflib.get_close_matches(loc[-1], keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(keys)})"
        return f"{path}: unknown key{hint}"
    if kind in ("union_tag_invalid", "literal_error") and loc and loc[-1] == "kind" or kind == "union_tag_invalid":
        bad = value.get("kind") if isinstance(value, dict) else value
        return f"{path if loc[-1] == 'kind' else path + '.kind'}: unknown engine {bad!r}; available: {', '.join(engines.available())}"
    if kind == "missing":
        return f"{path}: required"
    if kind == "value_error" and not loc:  # whole-config checks name their own field path
        return message.removeprefix("Value error, ")
    if kind in ("value_error", "assertion_error"):
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if message.startswith((f"{path}.", f"{path}:")):  # the check named its own, deeper field path
            return message
        if isinstance(value, (str, int, float)) and repr(value) not in message and str(value) not in message:
            return f"{path}: {value!r}: {message}"
        return f"{path}: {message}"
    return f"{path}: {value!r}: {message[0].lower() + message[1:]}" if not isinstance(value, dict) else f"{path}: {message}"


def _engine_model_at(data: Any, loc: tuple) -> type[BaseModel] | None:
    """The engine config model for the mapping at ``loc`` of the raw config, by its ``kind``."""
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif isinstance(part, str) and part in engines.available() + ["mixture"]:
            continue  # a discriminator tag in the error path, not in the data
        else:
            return None
    if isinstance(node, dict) and isinstance(node.get("kind"), str):
        try:
            return engines.spec_class(node["kind"]) if node["kind"] != "mixture" else MixtureSpec
        except ValueError:
            return None
    return None


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (for key suggestions)."""
    model: Any = ExperimentConfig
    for part in loc:
        if part.isdigit():
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        annotation = field.annotation
        model = _first_model(annotation)
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None
