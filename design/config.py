"""The experiment config as pydantic models: every field with a default and a description.

The models compose domain types defined where they belong — the game rule in the core
(``core.game.GameRule``), engine specs beside the engines (``engines``), population
specs and backstory settings in ``populations``. Every field has a description, which
``keynes config`` prints as the reference. Reading a config imports no orchestration
(Prefect, Ray); ``design.loading`` reads YAML, applies overrides and words the errors.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

import engines
from core.game import GameOverride, GameRule, Groups, History
from design.arms import Arm
from engines import SamplingSettings
from engines.mixture import MixtureSpec
from populations.backstories import BackstoryConfig
from populations.spec import PopulationSpec, SpecError, load_spec, parse_spec
from prompts.modes import MODES, custom_mode


class ConfigError(ValueError):
    """A config problem, as one line: ``field.path: what is wrong``."""


#: Every registered engine, plus a mixture of them (several engines in one game).
EngineConfig = engines.spec_union(MixtureSpec)


def _template_problem(path: str) -> str | None:
    """Why a prompt template (a file in prompts/ or an absolute path) cannot be compiled, or
    None: missing, unreadable, a Jinja2 syntax error, an include that is missing."""
    import jinja2

    from prompts.render import template_variables

    try:
        template_variables(path)
    except jinja2.TemplateNotFound as exc:
        return f"template {path!r} not found" if Path(path).name == exc.name else f"template {path!r}: include {exc.name!r} not found"
    except jinja2.TemplateSyntaxError as exc:
        return f"template {path!r}, line {exc.lineno}: {' '.join(str(exc.message).split())}"
    except (OSError, UnicodeDecodeError) as exc:
        return f"template {path!r} cannot be read ({getattr(exc, 'strerror', None) or exc})"
    return None


def _not_finite(data: Any) -> tuple[str, float] | None:
    """The dotted path and value of the first NaN or infinite number in a config's data."""
    pending: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while pending:
        where, value = pending.pop(0)
        if isinstance(value, float) and not math.isfinite(value):
            return ".".join(where), value
        if isinstance(value, dict):
            pending += [((*where, str(k)), v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            pending += [((*where, str(i)), v) for i, v in enumerate(value)]
    return None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PopulationConfig(Strict):
    """Who plays: a spec (file or inline attributes) and how many agents."""

    spec: str | None = Field(None, description="A population spec file (YAML); names are also looked up in populations/.")
    attributes: dict[str, Any] | None = Field(None, description="Inline attributes, in the spec file format (instead of `spec`).")
    sampling: str | None = Field(None, description="Override the spec's sampling mode: quota or iid.")
    size: int = Field(100, gt=0, description="Number of agents.")
    backstories: BackstoryConfig = Field(default_factory=BackstoryConfig, description="LLM-written backgrounds for personas.")

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
        except OSError as exc:  # a folder, a name too long for the file system
            raise ValueError(f"population.spec: {self.spec!r} cannot be read ({exc.strerror})") from None
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
        try:
            problem = _template_problem(self.mode().template)
        except OSError as exc:  # a name too long for the file system
            problem = f"template {self.template!r} cannot be read ({exc.strerror})"
        if problem:
            raise ValueError(problem)
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
        default_factory=lambda: [engines.spec_class("simulated")()], min_length=1,
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
        for i, mode in enumerate(prompts):
            if isinstance(mode, str) and mode not in MODES and not mode.endswith(".j2"):
                raise ValueError(f"unknown prompt mode {mode!r}; available: {', '.join(sorted(MODES))}")
            problem = _template_problem(mode) if isinstance(mode, str) and mode not in MODES else None
            if problem:  # a template file named as a mode
                raise ValueError(f"arms.prompts.{i}: {problem}")
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
    shard_size: int | None = Field(
        None, gt=0,
        description='Agents per shard: the unit of work sent to an actor and committed. None or "auto": keynes sizes them '
                    "from the population, the actors and the engine (a few shards per actor; kept when a run resumes).",
    )
    dashboard: bool = Field(False, description="Start the Ray dashboard with a local Ray.")

    @field_validator("shard_size", mode="before")
    @classmethod
    def _auto(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.strip().lower() == "auto" else value


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
            except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
                raise ValueError(f"unknown time zone {zone!r} (an IANA name such as Europe/Berlin)") from None
        return zone

    @model_validator(mode="after")
    def _one_kind(self) -> "ScheduleConfig":
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give exactly one of `cron` or `interval_s`")
        return self


#: Characters an experiment's name may not hold: a path separator for its report file (either
#: system's) and what Prefect refuses in a deployment's name.
NAME_REFUSES = frozenset("/\\%&<>")
#: The longest name: ``<name>-report.html`` must fit a file name (255 bytes on most systems).
NAME_LENGTH = 200


class ExperimentConfig(Strict):
    """A keynes experiment."""

    # `continue` is a Python keyword: the field is `continue_`, read and written as `continue`.
    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True, validate_by_name=True)

    name: str = Field(description="The experiment's name; with the config hash it identifies the experiment. It names the report "
                                  "file and the Prefect deployment: up to 200 characters, none of / \\ % & < > or control characters.")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="The seed every random choice derives from.")
    population: PopulationConfig = Field(default_factory=PopulationConfig, description="Who plays.")
    game: GameRule = Field(default_factory=GameRule, description="The rule of the game.")
    arms: ArmsConfig = Field(default_factory=ArmsConfig, description="What is compared.")
    groups: Groups | None = Field(None, description="Split the population into groups that each play their own game: {by: attribute} or {rooms: k}.")
    workers: WorkersConfig = Field(default_factory=WorkersConfig, description="Where agents play.")
    db: str = Field("keynes.duckdb", description="The DuckDB warehouse file.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="The report page.")
    schedule: ScheduleConfig | None = Field(None, description="When `keynes serve` runs this experiment by itself.")
    models: str | None = Field(
        None,
        description="A models profile (`keynes run --models`): a shipped one (laptop, served, hosted; experiments/profiles/) or a "
        "profile file. Its engines replace the config's LLM engines (and the backstory engine) and its `set:` overrides "
        "apply before the command line's (docs/paper.md). Recorded with the config; the experiment id covers the engines it put there.",
    )
    continue_: bool = Field(
        False,
        alias="continue",
        description="Each run plays only the next unfinished round (history from the warehouse), until game.rounds.",
    )

    @field_validator("name")
    @classmethod
    def _a_name_for_files_and_deployments(cls, name: str) -> str:
        """The name names the report file (``<name>-report.html``) and the Prefect deployment,
        whose names refuse / % & < > (and a report server's page address holds it)."""
        why = "it names the report file and the Prefect deployment"
        if not name.strip():
            raise ValueError(f"{name!r}: an experiment needs a name ({why})")
        odd = sorted({c for c in name if c in NAME_REFUSES or not c.isprintable()})
        if odd:
            raise ValueError(f"{name!r} holds {', '.join(map(repr, odd))}: a name may not hold / \\ % & < > or control characters ({why})")
        if len(name) > NAME_LENGTH:
            raise ValueError(f"{len(name)} characters: at most {NAME_LENGTH} ({why})")  # the error shows the name's start
        if name in (".", ".."):
            raise ValueError(f"{name!r} is no file name ({why})")
        return name

    @model_validator(mode="after")
    def _groups_and_games_fit(self) -> "ExperimentConfig":
        where = _not_finite(self.model_dump())
        if where:
            raise ValueError(f"{where[0]}: {where[1]}: input should be a finite number")
        spec = self.population.load()
        if self.groups is not None and self.groups.by is not None and self.groups.by not in spec.attributes:
            known = ", ".join(spec.attributes) or "none"
            raise ValueError(f"groups.by: {self.groups.by!r} is not a population attribute (attributes: {known})")
        for i, game in enumerate(self.arms.games):
            try:
                game.apply(self.game)
            except ValidationError as exc:
                raise ValueError(f"arms.games.{i}: {exc.errors(include_url=False)[0]['msg'].removeprefix('Value error, ')}") from None
        for i, prompt in enumerate(self.arms.prompts):
            if isinstance(prompt, str) and prompt in MODES and MODES[prompt].needs_backstory and not self.population.backstories.enabled:
                raise ValueError(f"arms.prompts.{i}: mode {prompt!r} shows each persona's backstory, but population.backstories "
                                 "is not enabled (enable it, or use the 'persona' mode)")
        self._own_templates_render(spec)
        return self

    def _own_templates_render(self, spec: PopulationSpec) -> None:
        """Render each user template as rounds 1 and 2 for three personas of the population (with
        a stand-in backstory when backstories are enabled), so
        that a template that cannot render (an unknown variable, ``{{ 1/0 }}``) stops the run
        before it writes anything."""
        from dataclasses import replace

        import polars as pl

        from design.budget import longest_prompts
        from populations.sampler import sample

        own = {i: p if isinstance(p, str) else p.name for i, p in enumerate(self.arms.prompts) if not (isinstance(p, str) and p in MODES)}
        if not own:
            return
        personas = sample(spec, 3, self.seed)
        if self.population.backstories.enabled:  # written by an LLM during the run: a stand-in text here
            personas = personas.with_columns(background=pl.lit("A backstory written for this persona."))
        if self.groups is not None:
            personas = personas.with_columns(self.groups.assign(personas, self.seed))
        arms = self.arms_list()
        for i, name in own.items():
            arm = next(a for a in arms if a.prompt_mode == name)
            try:
                for rounds in sorted({1, min(arm.rule.rounds, 2)}):
                    longest_prompts(replace(arm, rule=arm.rule.with_overrides(rounds=rounds)), personas)
            except Exception as exc:  # the user's template: whatever it raises is its own error
                raise ValueError(f"arms.prompts.{i}: template {arm.mode.template!r} does not render ({type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())})") from None

    @property
    def config_hash(self) -> str:
        """A hash of everything that decides results (not where they are stored or computed)."""
        # Where results are stored or computed, when runs happen (schedule, one round per
        # run) and the report do not decide results; a models profile decides them through
        # the engines and settings it put in the config, which the hash covers.
        data = self.model_dump(mode="json", exclude={"db", "workers", "report", "schedule", "continue_", "models"})
        if self.game.history == History():  # the default: configs from before game.history keep their hash
            del data["game"]["history"]
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
