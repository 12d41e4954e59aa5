"""A config's text: YAML read strictly, ``--set`` overrides applied, validation errors as one line.

A validation error becomes ``field.path: what is wrong`` with the bad value; an unknown key gets
the nearest known key as a suggestion (from the engine's own fields for engine settings). Used by
the experiment's config (design/loading.py) and the models profiles (design/profiles.py).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Hashable
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

import engines
from design.config import ConfigError, ExperimentConfig
from engines.mixture import MixtureSpec

class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, its YAML 1.1 timestamps included whatever else is imported: a library
    vLLM imports (lm-format-enforcer) makes every ``SafeLoader`` read timestamps as strings."""


_Loader.add_constructor("tag:yaml.org,2002:timestamp", yaml.constructor.SafeConstructor.construct_yaml_timestamp)


def read_yaml(origin: str, text: str) -> dict:
    """``yaml.safe_load``, refusing what it would take silently (a key given twice: the later
    would win) or fail on without a YAML error (a 13th month, a 5,000-digit number)."""
    try:
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            if root is not None:
                _check_nodes(origin, loader, root)
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{origin}: {where}invalid YAML ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{origin}: invalid YAML (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of settings, got {type(data).__name__}")
    return data


def _check_nodes(origin: str, loader: _Loader, root: yaml.Node) -> None:
    """Construct every scalar of the document (keys and values) and compare each mapping's
    keys, walking the nodes without recursion; an error names the field path and line."""
    pending: list[tuple[tuple[str, ...], yaml.Node]] = [((), root)]
    seen: set[int] = set()  # an alias is its anchor's node: each once (and no loop)

    def scalar(path: tuple[str, ...], node: yaml.Node) -> Any:
        try:
            return loader.construct_object(node)
        except (ValueError, OverflowError) as exc:
            where = ".".join(map(_part, path)) or origin
            raise ConfigError(f"{where}: {shown(node.value)} on line {node.start_mark.line + 1} is not valid YAML ({exc})") from None

    while pending:
        path, node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            scalar(path, node)
        elif isinstance(node, yaml.SequenceNode):
            pending += [((*path, str(i)), item) for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    pending.append((path, value_node))  # merged mappings; unhashable keys fail in construction
                    continue
                key = scalar(path, key_node)
                line = key_node.start_mark.line + 1
                if isinstance(key, Hashable) and key in lines:
                    where = ".".join(map(_part, (*path, str(key))))
                    raise ConfigError(f"{where}: given twice (lines {lines[key]} and {line} of {origin}); keep one")
                if isinstance(key, Hashable):
                    lines[key] = line
                pending.append(((*path, str(key)), value_node))


def apply_override(data: dict, item: str) -> None:
    """Set ``dotted.key=value`` in a nested mapping (list items by index); the value is YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.load(raw, Loader=_Loader) if raw != "" else ""  # noqa: S506 (a safe loader)
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError):  # not YAML: the text itself
        value = raw
    parts = key.strip().split(".")
    if "" in parts:
        raise ConfigError(f"--set {shown(item)}: expected dotted.key=value, without empty keys")
    node: Any = data
    for i, part in enumerate(parts):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{'.'.join(map(_part, parts[: i + 1]))}: no item {shown(part)} in a list of {len(node)}")
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
        else:  # a number or text where the key needs a mapping
            raise ConfigError(f"{'.'.join(map(_part, parts[:i]))}: {shown(node)} has no field {shown(part)} (--set {shown(key)})")
        if i == len(parts) - 1:
            node[index] = value
            return
        if isinstance(node, dict) and node.get(part) is None:
            node[part] = {}
        node = node[index]


def format_error(exc: ValidationError, data: Any = None) -> str:
    """The first validation error as ``field.path: message`` with the bad value."""
    error = exc.errors(include_url=False)[0]
    loc = [_part(str(p)) for p in error["loc"]]
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
    if kind == "invalid_key":  # YAML reads `1:` or `null:` as a number or None
        return f"{path}: unknown key (a key is a name, not {shown(error.get('input'))})"
    if kind == "value_error" and not loc:  # whole-config checks name their own field path
        return message.removeprefix("Value error, ")
    if kind in ("value_error", "assertion_error"):
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if message.startswith((f"{path}.", f"{path}:")):  # the check named its own, deeper field path
            return message
        if isinstance(value, (str, int, float)) and repr(value) not in message and str(value) not in message:
            return f"{path}: {shown(value)}: {message}"
        return f"{path}: {message}"
    return f"{path}: {shown(value)}: {message[0].lower() + message[1:]}" if not isinstance(value, dict) else f"{path}: {message}"


def _part(key: str) -> str:
    """A key as an error path shows it: as typed, or quoted when it holds more than letters,
    digits, ``_`` and ``-`` (an empty key, a dot, a line break)."""
    return key if re.fullmatch(r"[\w-]+|\[key\]", key) else repr(key)


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, shortened to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
