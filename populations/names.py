"""Locale-aware person names, a million at a time.

Faker's per-call API costs microseconds per name; instead its locale's first- and
last-name lists (with their frequency weights where the locale has them) are read once
and indexed with numpy, drawing from the spec's seeded stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from core.quotas import quota_counts

_FEMALE = ("f", "female", "woman", "women", "girl")
_MALE = ("m", "male", "man", "men", "boy")
_KINDS = ("female", "male", "any")


#: Resolution of the lookup table that turns uniform draws into names (2^20 slots).
_SLOTS = 1 << 20


@dataclass(frozen=True)
class NameList:
    """Names, their probabilities, and a lookup table of ``_SLOTS`` codes in proportion
    to them: one integer draw and one gather per name, instead of a binary search."""

    names: pl.Series
    p: np.ndarray
    table: np.ndarray

    def codes(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.table[rng.integers(0, _SLOTS, n)]


def _name_list(values: object) -> NameList:

    if isinstance(values, dict):  # name → frequency weight
        names, weights = list(values), np.array(list(values.values()), dtype=np.float64)
    else:  # some locales repeat a name to weight it
        counts: dict[str, int] = {}
        for name in values:
            counts[name] = counts.get(name, 0) + 1
        names, weights = list(counts), np.array(list(counts.values()), dtype=np.float64)
    p = weights / weights.sum()
    table = np.repeat(np.arange(len(names), dtype=np.uint32), quota_counts(p, _SLOTS))
    return NameList(pl.Series(names, dtype=pl.String), p, table)


@lru_cache(maxsize=8)
def locale_names(locale: str) -> dict[str, NameList]:
    """The locale's name lists: ``female``, ``male``, ``any`` first names and ``last``.

    Raises:
        ValueError: Faker has no such locale, or it has no person names.
    """
    import importlib

    # The locale's person provider alone: building a Faker (or listing its locales)
    # imports every provider and costs a second or more.
    try:
        person = importlib.import_module(f"faker.providers.person.{locale}").Provider
    except ModuleNotFoundError:
        raise ValueError(f"names.locale: unknown locale {locale!r} (e.g. en_US, de_DE, fr_FR, ja_JP)") from None
    if person is None or not getattr(person, "last_names", None):
        raise ValueError(f"names.locale: locale {locale!r} has no person names")
    female = getattr(person, "first_names_female", None) or getattr(person, "first_names")
    male = getattr(person, "first_names_male", None) or getattr(person, "first_names")
    both = getattr(person, "first_names", None) or _merge(female, male)
    return {"female": _name_list(female), "male": _name_list(male), "any": _name_list(both), "last": _name_list(person.last_names)}


def _merge(a: object, b: object) -> object:
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b}
    return [*a, *b]


def gender_kind(value: str) -> str:
    """``female``, ``male`` or ``any`` for an attribute value like "Female" or "Man"."""
    v = value.strip().lower()
    return "female" if v in _FEMALE else "male" if v in _MALE else "any"


def draw_names(
    n: int, locale: str, rng: np.random.Generator, gender: tuple[list[str], np.ndarray] | None = None
) -> pl.Series:
    """``n`` full names ("First Last"); first names follow ``gender`` (labels, codes) when given.

    Args:
        n: how many names.
        locale: a Faker locale.
        rng: the seeded stream to draw from.
        gender: the gender attribute's labels and per-persona codes, or None.
    """
    lists = locale_names(locale)
    last = lists["last"].names.gather(pl.Series(lists["last"].codes(n, rng)))
    if gender is None:
        first = lists["any"].names.gather(pl.Series(lists["any"].codes(n, rng)))
    else:
        labels, codes = gender
        kinds = np.array([_KINDS.index(gender_kind(label)) for label in labels], dtype=np.uint8)[codes]
        # One list of every first name; each persona draws from its kind's slice.
        pools = [lists[k] for k in _KINDS]
        offsets = np.cumsum([0] + [len(pool.names) for pool in pools])
        picks = np.empty(n, dtype=np.uint32)
        for k, pool in enumerate(pools):
            members = np.flatnonzero(kinds == k)
            picks[members] = offsets[k] + pool.codes(len(members), rng)
        first = pl.concat([pool.names for pool in pools]).gather(pl.Series(picks))
    return pl.DataFrame({"first": first, "last": last}).select(pl.concat_str("first", "last", separator=" ").alias("name")).to_series()
