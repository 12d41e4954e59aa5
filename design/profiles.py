"""Models profiles: one switch (``keynes run CONFIG --models laptop``) that moves an experiment onto
other engines, its backstory engine included, and sizes it for them.

A profile is a YAML file with ``engines:`` (engine blocks) and ``set:`` (``--set``-style
overrides). The config's distinct LLM engines (kinds llamacpp, openai, vllm; in ``arms.engines``,
inside mixtures, and ``population.backstories.engine``), in order of first appearance, map onto
the profile's engines in order, cycling when the config has more. An engine block without a
``model`` keeps the model of the engine it replaces. Engines that map onto the same engine merge:
``arms.engines`` keeps one of each, a mixture's components add their fractions, and a mixture
left with one component is that engine. String values may read the environment (``${VAR}``, or
``${VAR:-default}`` when unset or empty), in profiles only. Shipped profiles live in
``experiments/profiles/`` and are named without the folder and ``.yaml``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import engines
from design.config import ConfigError
from design.syntax import apply_override, format_error, read_yaml

#: The shipped profiles, by name (``laptop`` is ``experiments/profiles/laptop.yaml``).
PROFILE_DIR = Path(__file__).resolve().parents[1] / "experiments" / "profiles"
#: Engine kinds a profile replaces; the others (simulated) play as configured.
LLM_KINDS = ("llamacpp", "openai", "vllm")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class Profile:
    """A loaded profile: its reference as given (a name or a path), its file, its engine blocks
    (variables read) and its overrides."""

    ref: str
    path: Path
    engines: tuple[dict, ...]
    overrides: tuple[str, ...]

    def key(self) -> str:
        """Everything the profile decides, as text (variables read): a changed value is a new key."""
        return json.dumps([self.ref, list(self.engines), list(self.overrides)], sort_keys=True)


def shipped() -> list[str]:
    """The names of the shipped profiles."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(ref: str) -> Profile:
    """The profile a name (``laptop``) or a YAML file's path names, its variables read.

    Raises:
        ConfigError: one line naming ``models``, the profile and what is wrong (an unknown
            name, a missing variable, an invalid engine block or override).
    """

    ref = str(ref).strip()
    try:
        path = PROFILE_DIR / f"{ref}.yaml" if ref in shipped() else Path(ref).expanduser()
        found = path.is_file()
    except (OSError, RuntimeError, ValueError):  # a name too long, an unknown ~user
        found = False
    if not found:
        shown = ref if len(ref) <= 80 else ref[:79] + "…"
        raise ConfigError(f"models: {shown!r} is neither a shipped profile ({', '.join(shipped())}) nor a profile file")
    where = f"models: {ref}" if path.parent == PROFILE_DIR else f"models: {path}"
    try:
        data = read_yaml(where, path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read the profile ({getattr(exc, 'strerror', None) or exc})") from None
    unknown = sorted(set(data) - {"description", "engines", "set"})
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]}: unknown key (known keys: description, engines, set)")
    blocks, overrides = data.get("engines"), data.get("set") or []
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict) for b in blocks):
        raise ConfigError(f"{where}: engines: expected a list of engine blocks (mappings with `kind:`)")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{where}: set: expected a list of dotted.key=value overrides")
    blocks = [_read_variables(where, f"engines.{i}", b) for i, b in enumerate(blocks)]
    overrides = [_read_variables(where, f"set.{i}", o) for i, o in enumerate(overrides)]
    for i, block in enumerate(blocks):
        _check_block(where, i, block)
    return Profile(ref, path, tuple(blocks), tuple(overrides))


def _read_variables(where: str, field: str, value: Any) -> Any:
    """``value`` with every ``${VAR}`` / ``${VAR:-default}`` in its strings replaced."""
    if isinstance(value, dict):
        return {k: _read_variables(where, f"{field}.{k}", v) for k, v in value.items()}
    if isinstance(value, list):
        return [_read_variables(where, f"{field}.{i}", v) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def read(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        found = os.environ.get(name)
        if found:
            return found
        if default is not None:
            return default
        raise ConfigError(f"{where}: ${name} is not set ({field}); export {name}=...")

    return _VARIABLE.sub(read, value)


def _check_block(where: str, index: int, block: dict) -> None:
    """An engine block the profile gives, validated as its kind's config (a block without a
    model is checked with the kind's default model where it has one, else a stand-in name)."""

    if block.get("kind") not in LLM_KINDS:
        raise ConfigError(f"{where}: engines.{index}.kind: {block.get('kind')!r}; a profile's engines are LLM engines ({', '.join(LLM_KINDS)})")
    checked = block if block.get("model") else {**block, "model": _default_model(block["kind"]) or "model"}
    try:
        engines.parse_spec(checked)
    except ValidationError as exc:
        raise ConfigError(f"{where}: engines.{index}.{format_error(exc, checked)}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: engines.{index}: {exc}") from None


def _default_model(kind: str) -> str | None:
    field = engines.spec_class(kind).model_fields.get("model")
    return field.default if field is not None and isinstance(field.default, str) else None


def llm_engines(data: dict) -> list[dict]:
    """The config's distinct LLM engine blocks, in order of first appearance: the arms'
    (a mixture's components in order), then the backstory engine's."""
    found: dict[str, dict] = {}

    def visit(block: Any) -> None:
        if not isinstance(block, dict):
            return
        if block.get("kind") == "mixture":
            for component in block.get("components") or []:
                visit(component.get("engine") if isinstance(component, dict) else None)
        elif block.get("kind") in LLM_KINDS:
            found.setdefault(_text(block), block)

    for block in (data.get("arms") or {}).get("engines") or []:
        visit(block)
    visit(((data.get("population") or {}).get("backstories") or {}).get("engine"))
    return list(found.values())


def _text(block: dict) -> str:
    return json.dumps(block, sort_keys=True)


def apply_profile(data: dict, profile: Profile) -> dict:
    """The config's data with its LLM engines replaced by the profile's (see the module
    docstring), the profile's overrides applied and ``models`` set to the profile's reference."""

    mapping = {}
    for i, block in enumerate(llm_engines(data)):
        target = dict(profile.engines[i % len(profile.engines)])
        if not target.get("model"):
            model = block.get("model") or _default_model(block["kind"])
            target = {**target, "model": model} if model else {k: v for k, v in target.items() if k != "model"}
        mapping[_text(block)] = target

    def replaced(block: Any) -> Any:
        if not isinstance(block, dict):
            return block
        if block.get("kind") == "mixture" and isinstance(block.get("components"), list):
            merged: dict[str, dict] = {}
            for component in block["components"]:
                if not isinstance(component, dict) or not isinstance(component.get("fraction"), (int, float)):
                    return block  # not a mixture's shape: validation says what is wrong
                engine = replaced(component.get("engine"))
                seen = merged.setdefault(_text(engine) if isinstance(engine, dict) else repr(engine), {**component, "engine": engine, "fraction": 0.0})
                seen["fraction"] = round(seen["fraction"] + component["fraction"], 9)
            if len(merged) == 1:
                return next(iter(merged.values()))["engine"]
            return {**block, "components": list(merged.values())}
        return mapping.get(_text(block), block)

    out = json.loads(json.dumps(data))
    arms = out.get("arms")
    if isinstance(arms, dict) and isinstance(arms.get("engines"), list):
        kept: dict[str, Any] = {}
        for block in arms["engines"]:
            engine = replaced(block)
            kept.setdefault(_text(engine) if isinstance(engine, dict) else repr(engine), engine)
        arms["engines"] = list(kept.values())
    backstories = (out.get("population") or {}).get("backstories")
    if isinstance(backstories, dict) and "engine" in backstories:
        backstories["engine"] = replaced(backstories["engine"])
    for item in profile.overrides:
        try:
            apply_override(out, item)
        except ConfigError as exc:
            raise ConfigError(f"models: {profile.ref}: set: {exc}") from None
    out["models"] = profile.ref
    return out
