"""``keynes config``: every config field with its description and default, then every engine kind's fields."""

from __future__ import annotations

from rich.text import Text

from cli.common import bold, out


def config_reference() -> None:
    """Print every config field with its description, then every engine kind's fields.

    Example: keynes config
    """
    from pydantic import BaseModel

    import engines
    from design.config import ExperimentConfig

    def walk(model: type[BaseModel], prefix: str = "") -> None:
        for name, field in model.model_fields.items():
            name = field.alias or name  # `continue` is spelled `continue_` in Python
            if prefix and name == "kind" and not field.description:
                continue  # an engine's kind heads its section
            annotation = field.annotation
            if getattr(annotation, "__args__", None) and type(None) in annotation.__args__:
                inner = [a for a in annotation.__args__ if a is not type(None)]
                annotation = inner[0] if len(inner) == 1 else annotation  # `X | None` documents X
            default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)!r})"
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                out.print(bold(f"{prefix}{name}", f": {field.description}"), highlight=False)
                walk(annotation, f"{prefix}{name}.")
            else:
                out.print(bold(f"{prefix}{name}", f": {field.description}{default}"), highlight=False)

    walk(ExperimentConfig)
    out.print(Text("\n").append(bold("Engines", " (each entry of arms.engines, and population.backstories.engine), by kind:")), highlight=False)
    from engines.mixture import MixtureComponent, MixtureSpec

    for kind, spec in [*((kind, engines.spec_class(kind)) for kind in engines.available()), ("mixture", MixtureSpec)]:
        summary = (spec.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out.print(Text("\n").append(bold(f"kind: {kind}", f" — {summary}")), highlight=False)
        walk(spec, f"{kind}.")
    walk(MixtureComponent, "mixture.components.N.")
