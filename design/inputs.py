"""An experiment's inputs beyond its config: the text of every prompt template its arms render
(with every file they include), each model's identity and each chat template, as digests by name.

The experiment id is the config's hash, which names a prompt mode or a model but not what it
holds. The flow records an experiment's inputs when it first runs (``experiments.inputs``) and
refuses a later run of the same id whose inputs differ, before anything runs: answers computed
from two sets of inputs never share an id. Only names recorded on both sides are compared, so an
experiment recorded before inputs were (or before a kind of input was) is accepted and gets them
recorded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

from design.arms import Arm
from design.config import ConfigError, ExperimentConfig
from engines import EngineSpec
from engines.identity import REPORTED
from engines.mixture import MixtureSpec
from prompts.modes import TEMPLATE_DIR
from prompts.render import template_files

#: A hub id whose revision was not downloaded when it was recorded (``engines.identity.hub_revision``).
UNRESOLVED = "@main"


class InputsChanged(ConfigError):
    """A rerun's inputs differ from those its experiment was first run with (one line)."""


def template_name(file: str | Path) -> str:
    """A template file's name in the inputs, the same from any working folder: ``prompts/cot.j2``
    for keynes's own, the absolute path for any other."""
    path, own = Path(file).resolve(), TEMPLATE_DIR.resolve()
    return f"prompts/{path.relative_to(own).as_posix()}" if path.is_relative_to(own) else str(path)


def shown(name: str) -> str:
    """An input's name as the refusal says it: a file under the working folder relative to it."""
    kind, _, file = name.partition(" ")
    if kind != "template":
        return name if name.startswith("model") else f"the {name}"
    path = Path(file)
    return path.relative_to(Path.cwd()).as_posix() if path.is_absolute() and path.is_relative_to(Path.cwd()) else file


def models(engine: EngineSpec | MixtureSpec) -> Iterator[EngineSpec]:
    """The engines of an arm: its engine, or a mixture's components."""
    if isinstance(engine, MixtureSpec):
        for component in engine.components:
            yield from models(component.engine)
    else:
        yield engine


def arm_inputs(arm: Arm) -> dict[str, str]:
    """One arm's inputs: ``template <file>`` for its template and each include (sha256 of the
    text), ``model <name>`` (``EngineSpec.identity``), ``chat template of model <name>``."""
    out = {f"template {template_name(file)}": "sha256:" + hashlib.sha256(text.encode()).hexdigest()
           for file, text in template_files(arm.mode.template).items()}
    for spec in models(arm.engine):
        out.update(spec.identity())
        chat = spec.prompting().chat_template_sha256
        if chat:
            out[f"chat template of model {spec.model_name}"] = f"sha256:{chat}"
    return dict(sorted(out.items()))


def fingerprint(cfg: ExperimentConfig, arms: list[Arm] | None = None) -> dict[str, str]:
    """Every arm's inputs, by name (see ``arm_inputs``).

    Raises:
        ConfigError: a model that cannot be found or read, naming its engine.
    """
    from engines.models import ModelError

    out: dict[str, str] = {}
    for arm in arms if arms is not None else cfg.arms_list():
        try:
            out.update(arm_inputs(arm))
        except (ModelError, OSError, ValueError) as exc:
            index = next((i for i, e in enumerate(cfg.arms.engines) if e == arm.engine), 0)
            raise ConfigError(f"arms.engines.{index}: {getattr(exc, 'strerror', None) or exc}") from None
    return dict(sorted(out.items()))


def _served_unresolved(value: str) -> bool:
    """A served model recorded without what its server reports (an older record, or a server that
    did not answer; ``OpenAISpec.identity``)."""
    return value.startswith("served:") and f" {REPORTED}" not in value


def _same(recorded: str, current: str) -> bool:
    """Equal digests, a hub id recorded before its revision was downloaded, or a served model
    recorded (or now seen) without its server's report, the same server and name."""
    if recorded == current:
        return True
    if recorded.startswith("served:") and current.startswith("served:"):
        bare = [v.partition(f" {REPORTED}")[0] for v in (recorded, current)]
        return (_served_unresolved(recorded) or _served_unresolved(current)) and bare[0] == bare[1]
    unresolved = recorded if recorded.endswith(UNRESOLVED) else current if current.endswith(UNRESOLVED) else None
    return unresolved is not None and recorded.startswith("hf:") and recorded.split("@")[0] == current.split("@")[0]


def changed(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """The names recorded on both sides whose digests differ, in name order."""
    return [name for name in sorted(recorded.keys() & current.keys()) if not _same(recorded[name], current[name])]


def check_inputs(experiment_id: str, recorded: dict[str, str] | None, current: dict[str, str]) -> dict[str, str]:
    """What to record for the experiment once this run goes on: the recorded inputs, with the
    names not recorded yet (all of them for an experiment recorded before inputs were) and hub
    revisions resolved since.

    Raises:
        InputsChanged: an input differs; one line names it and how to go on.
    """
    recorded = recorded or {}
    names = changed(recorded, current)
    if names:
        what = shown(names[0])
        more = f" (and {len(names) - 1} more: {', '.join(map(shown, names[1:]))})" if len(names) > 1 else ""
        raise InputsChanged(
            f"{what} changed since experiment {experiment_id} was first run{more}; to go on, run it as a new experiment "
            f"(--set name=NEW_NAME) or restore {what.removeprefix('the ')}"
        )
    resolved = {n: v for n, v in current.items()
                if n in recorded and (recorded[n].endswith(UNRESOLVED) or _served_unresolved(recorded[n]) and not _served_unresolved(v))}
    return dict(sorted({**current, **recorded, **resolved}.items()))
