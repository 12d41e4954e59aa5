"""The experiment config: YAML in, pydantic models out, one clear line per error.

The models compose domain types defined where they belong — the game rule beside
the environment (``tasks.environment.GameRule``), engine specs beside the engines
(``tasks.engines``), population specs in ``populations``. Every field has a
description, which ``keynes config`` prints as the reference.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from populations.spec import PopulationSpec, SpecError, load_spec, parse_spec
from prompts.modes import MODES, custom_mode
from tasks import engines
from tasks.engines import SamplingSettings
from tasks.engines.mixture import MixtureSpec
from tasks.environment import GameOverride, GameRule, Groups
from tasks.personas import Backstories
from tasks.play import Arm


class ConfigError(ValueError):
    """A config problem, as one line: ``field.path: what is wrong``."""


def _engine_union() -> Any:
    # Every registered engine, plus a mixture of them (several engines in one game).
    classes = tuple(engines.spec_class(kind) for kind in engines.available()) + (MixtureSpec,)
    return Annotated[Union[classes], Field(discriminator="kind")]


EngineConfig = _engine_union()


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PopulationConfig(Strict):
    """Who plays: a spec (file or inline attributes) and how many agents."""

    spec: str | None = Field(None, description="A population spec file (YAML); names are also looked up in populations/.")
    attributes: dict[str, Any] | None = Field(None, description="Inline attributes, in the spec file format (instead of `spec`).")
    sampling: str | None = Field(None, description="Override the spec's sampling mode: quota or iid.")
    size: int = Field(100, gt=0, description="Number of agents.")
    backstories: Backstories = Field(default_factory=Backstories, description="LLM-written backgrounds for personas.")

    def load(self) -> PopulationSpec:
        """The population spec this config names (inline attributes win over the file)."""
        if self.attributes is not None:
            data: dict[str, Any] = {"name": "inline", "attributes": self.attributes}
            base = None
        elif self.spec is not None:
            try:
                base = load_spec(self.spec)
            except SpecError as exc:
                raise SpecError(f"population.spec: {exc}") from None
            data = base.model_dump()
        else:
            return PopulationSpec(name="anonymous", attributes={})
        if self.sampling:
            data["sampling"] = self.sampling
        return parse_spec(data, "population") if base is None or self.sampling else base

    @model_validator(mode="after")
    def _spec_loads(self) -> "PopulationConfig":
        # Errors in inline attributes keep their path (population.attributes.…); a spec
        # file's errors name the file.
        try:
            self.load()
        except FileNotFoundError:
            raise ValueError(f"spec {self.spec!r} not found (neither a file nor a name in populations/)") from None
        except ValidationError as exc:
            if self.attributes is not None:
                raise
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in error["loc"])
            raise ValueError(f"spec {self.spec!r}: {where}: {error['msg'].removeprefix('Value error, ')}") from None
        return self


class CustomPrompt(Strict):
    """A user's own Jinja2 template as a prompt mode."""

    name: str = Field(description="The mode's name, stored as the run's prompt_mode.")
    template: str = Field(description="The template file (.j2); it may include the shared _rules.j2 and _think.j2.")
    reasoning: bool = Field(True, description="Reason freely first (two-phase chain of thought), or answer directly.")

    @model_validator(mode="after")
    def _exists(self) -> "CustomPrompt":
        self.mode()
        return self

    def mode(self):
        return custom_mode(self.name, self.template, self.reasoning)


#: A prompt mode by name (or .j2 path), or a custom template mapping; the tag keeps errors precise.
PromptChoice = Annotated[
    Union[Annotated[str, Tag("builtin")], Annotated[CustomPrompt, Tag("custom")]],
    Discriminator(lambda v: "builtin" if isinstance(v, str) else "custom"),
]


class ArmsConfig(Strict):
    """The arms of the experiment: every combination of engine × prompt mode × game × temperature."""

    engines: list[EngineConfig] = Field(  # type: ignore[valid-type]
        default_factory=lambda: [engines.spec_class("simulated")()],
        description="Engines, each a mapping with `kind:` (llamacpp, openai, simulated, vllm) and its settings; "
        "`kind: mixture` with `components: [{engine: {...}, fraction: 0.5}, ...]` plays several engines in one game.",
    )
    prompts: list[PromptChoice] = Field(  # type: ignore[valid-type]
        ["basic"], min_length=1,
        description=f"Prompt modes: {', '.join(MODES)}; or your own template as {{name, template, reasoning}}.",
    )
    games: list[GameOverride] = Field(
        default_factory=lambda: [GameOverride()], min_length=1,
        description="Game variants compared as arms: each changes some fields of `game` (e.g. {ratio: 1/2}).",
    )
    temperatures: list[float] = Field([0.7], min_length=1, description="Sampling temperatures.")
    max_reasoning_tokens: int = Field(256, gt=0, description="Token budget of the free reasoning phase of modes that reason.")
    max_answer_tokens: int = Field(8, gt=0, description="Token budget of the (constrained) answer.")
    sampling: SamplingSettings = Field(default_factory=SamplingSettings, description="The sampling chain of every arm (top_p, top_k, min_p, repeat_penalty), the same on every engine.")

    @field_validator("prompts")
    @classmethod
    def _known_modes(cls, prompts: list[str | CustomPrompt]) -> list[str | CustomPrompt]:
        for mode in prompts:
            if isinstance(mode, str) and mode not in MODES and not mode.endswith(".j2"):
                raise ValueError(f"unknown prompt mode {mode!r}; available: {', '.join(sorted(MODES))}")
        return prompts

    @field_validator("temperatures")
    @classmethod
    def _non_negative(cls, values: list[float]) -> list[float]:
        for t in values:
            if t < 0:
                raise ValueError(f"temperature {t:g} is negative")
        return values


class WorkersConfig(Strict):
    """Where agents play: a local Ray or a cluster, and how the population is sharded."""

    ray_address: str | None = Field(None, description='A Ray cluster to join ("auto", "ray://host:10001"); none starts a local Ray.')
    actors: int = Field(2, gt=0, description="Ray actors per engine; each owns one engine instance.")
    shard_size: int = Field(1000, gt=0, description="Agents per shard: the unit of work sent to an actor and committed.")
    dashboard: bool = Field(False, description="Start the Ray dashboard with a local Ray.")


class ReportConfig(Strict):
    """The report page built after the last round (stage 5)."""

    enabled: bool = Field(True, description="Build the offline HTML report when the experiment finishes.")
    out: str | None = Field(None, description="The report file; none means <experiment name>-report.html next to the database.")


class ScheduleConfig(Strict):
    """When a served deployment runs by itself (``keynes serve``): a cron line or an interval."""

    cron: str | None = Field(None, description='A cron line, e.g. "0 * * * *" (every hour).')
    interval_s: float | None = Field(None, gt=0, description="Seconds between runs.")
    timezone: str | None = Field(None, description="The cron line's time zone (default UTC), e.g. Europe/Berlin.")

    @field_validator("cron")
    @classmethod
    def _cron_line(cls, cron: str | None) -> str | None:
        if cron is not None and len(cron.split()) not in (5, 6):
            raise ValueError(f"{cron!r} is not a cron line (5 fields: minute hour day-of-month month day-of-week)")
        return cron

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, zone: str | None) -> str | None:
        import zoneinfo

        if zone is not None:
            try:
                zoneinfo.ZoneInfo(zone)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {zone!r} (an IANA name such as Europe/Berlin)") from None
        return zone

    @model_validator(mode="after")
    def _one_kind(self) -> "ScheduleConfig":
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give exactly one of `cron` or `interval_s`")
        return self


class ExperimentConfig(Strict):
    """A keynes experiment."""

    # `continue` is a Python keyword: the field is `continue_`, read and written as `continue`.
    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True, validate_by_name=True)

    name: str = Field(description="The experiment's name; with the config hash it identifies the experiment.")
    seed: int = Field(0, ge=0, description="The seed every random choice derives from.")
    population: PopulationConfig = Field(default_factory=PopulationConfig, description="Who plays.")
    game: GameRule = Field(default_factory=GameRule, description="The rule of the game.")
    arms: ArmsConfig = Field(default_factory=ArmsConfig, description="What is compared.")
    groups: Groups | None = Field(None, description="Split the population into groups that each play their own game: {by: attribute} or {rooms: k}.")
    workers: WorkersConfig = Field(default_factory=WorkersConfig, description="Where agents play.")
    db: str = Field("keynes.duckdb", description="The DuckDB warehouse file.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="The report page.")
    schedule: ScheduleConfig | None = Field(None, description="When `keynes serve` runs this experiment by itself.")
    continue_: bool = Field(
        False,
        alias="continue",
        description="Each run plays only the next unfinished round (history from the warehouse), until game.rounds.",
    )

    @model_validator(mode="after")
    def _population_exists(self) -> "ExperimentConfig":
        spec = self.population.load()
        if self.groups is not None and self.groups.by is not None and self.groups.by not in spec.attributes:
            known = ", ".join(spec.attributes) or "none"
            raise ValueError(f"groups.by: {self.groups.by!r} is not a population attribute (attributes: {known})")
        for i, game in enumerate(self.arms.games):
            try:
                game.apply(self.game)
            except ValidationError as exc:
                raise ValueError(f"arms.games.{i}: {exc.errors(include_url=False)[0]['msg'].removeprefix('Value error, ')}") from None
        return self

    @property
    def config_hash(self) -> str:
        """A hash of everything that decides results (not where they are stored or computed)."""
        # Where results are stored or computed, when runs happen (schedule, one round per
        # run) and the report do not decide results.
        data = self.model_dump(mode="json", exclude={"db", "workers", "report", "schedule", "continue_"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def experiment_id(self) -> str:
        return f"{self.name}-{self.config_hash[:8]}"

    @property
    def report_path(self) -> str:
        """Where the report page goes: ``report.out``, else next to the database."""
        return self.report.out or str(Path(self.db).with_name(f"{self.name}-report.html"))

    def arms_list(self) -> list[Arm]:
        """Every arm: engines × prompt modes × games × temperatures, in a stable order.

        All arms play the same personas with the same seed, so comparisons are paired.
        """
        out: list[Arm] = []
        for engine in self.arms.engines:
            for prompt in self.arms.prompts:
                for game in self.arms.games:
                    for temperature in self.arms.temperatures:
                        index = len(out)
                        out.append(
                            Arm(
                                index=index,
                                run_id=f"{self.experiment_id}-arm{index}",
                                engine=engine,
                                prompt_mode=prompt if isinstance(prompt, str) else prompt.name,
                                temperature=temperature,
                                rule=game.apply(self.game),
                                max_reasoning_tokens=self.arms.max_reasoning_tokens,
                                max_answer_tokens=self.arms.max_answer_tokens,
                                custom=None if isinstance(prompt, str) else prompt.mode(),
                                sampling=self.arms.sampling,
                            )
                        )
        return out


# ------------------------------------------------------------------------------ loading
def load_config(source: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read a YAML file (or a mapping), apply ``dotted.key=value`` overrides, validate.

    Raises:
        ConfigError: one line naming the field path and the bad value.
    """
    if isinstance(source, dict):
        data = json.loads(json.dumps(source))
        origin = "config"
    else:
        path = Path(source)
        origin = str(path)
        if not path.exists():
            raise ConfigError(f"{origin}: no such config file")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"{origin}: {where}invalid YAML ({problem})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{origin}: expected a mapping of settings, got {type(data).__name__}")
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
