"""Loading an experiment config: YAML in, the models profile and ``--set`` overrides applied, one
clear line per error (design/syntax.py: the text's rules and messages).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from design.config import ConfigError, ExperimentConfig
from design.profiles import apply_profile, load_profile
from design.syntax import apply_override, format_error, read_yaml, shown

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
        origin = "config"
        try:
            text = json.dumps(source)  # read back below: the same plain data, in the same order
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConfigError(f"{origin}: not plain data ({str(exc).splitlines()[0]})") from None
    else:
        path = Path(source)
        origin = str(path) if str(path).isprintable() else repr(str(path))
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{origin}: no such config file") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{origin}: not UTF-8 text (byte {exc.start})") from None
        except (OSError, ValueError) as exc:  # a folder, a name too long, a NUL in the name
            raise ConfigError(f"{origin}: cannot read the config ({getattr(exc, 'strerror', None) or exc})") from None
    data = json.loads(text) if isinstance(source, dict) else read_yaml(origin, text)
    profile = _profile(data, overrides)
    key = json.dumps([origin, text, list(overrides), profile.key() if profile else None])
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = _parse(data, overrides, profile)
    return _PARSED[key]


def run_overrides(overrides: list[str] | tuple[str, ...] | None = None, db: str | Path | None = None, models: str | None = None) -> list[str]:
    """A run's overrides as ``load_config`` takes them: the models profile (``keynes run --models``)
    first, then ``overrides``, then the warehouse (``--db``)."""
    return ([f"models={models}"] if models else []) + list(overrides or []) + ([f"db={db}"] if db else [])


def _is_models(item: str) -> bool:
    return item.split("=", 1)[0].strip() == "models"


def _profile(data: dict, overrides: list[str] | tuple[str, ...]):
    """The models profile the config's ``models`` names after the ``models=`` overrides (the
    last wins), its variables read; None without one."""
    chosen: dict = {"models": data.get("models")}
    for item in overrides:
        if _is_models(item):
            apply_override(chosen, item)
    ref = chosen["models"]
    if ref is None or ref == "":
        return None
    if not isinstance(ref, str):
        raise ConfigError(f"models: {shown(ref)}: expected a profile name or file")
    return load_profile(ref)


def _parse(data: dict, overrides: list[str] | tuple[str, ...], profile=None) -> ExperimentConfig:
    """The config: the models profile applied first (``design.profiles``), then the other overrides."""
    if profile is not None:
        data = apply_profile(data, profile)
    for item in overrides:
        if not (profile is not None and _is_models(item)):
            apply_override(data, item)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, data)) from None


