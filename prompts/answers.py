"""Answer constraints and parsing: what a valid answer looks like, and reading it back.

``number_regex`` is the exact language engines constrain decoding to (``number_gbnf`` is
the same language as a llama.cpp grammar); ``parse_answers`` validates every answer after
generation (servers may ignore constraints) and keeps the reason when an answer is rejected.
"""

from __future__ import annotations

import math
import re

import polars as pl

NUMBER = r"-?\d+(?:\.\d+)?"


def _same_length(a: str, b: str) -> list[str]:
    """Alternatives matching the digit strings a..b of equal length (leading zeros allowed)."""
    if len(a) == 1:
        return [a if a == b else f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + "(?:" + "|".join(_same_length(a[1:], b[1:])) + ")"]
    n = len(a) - 1
    parts = [a[0] + "(?:" + "|".join(_same_length(a[1:], "9" * n)) + ")"]
    if int(b[0]) - int(a[0]) > 1:
        lo, hi = int(a[0]) + 1, int(b[0]) - 1
        parts.append((str(lo) if lo == hi else f"[{lo}-{hi}]") + f"[0-9]{{{n}}}")
    parts.append(b[0] + "(?:" + "|".join(_same_length("0" * n, b[1:])) + ")")
    return parts


def _int_range_regex(low: int, high: int) -> str:
    """A regex (no anchors) matching the decimal integers low..high, no leading zeros."""
    if low < 0 or low > high:
        raise ValueError(f"cannot build a regex for {low}..{high}")
    parts: list[str] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        lo = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        hi = min(high, 10**digits - 1)
        if lo <= hi:
            parts += _same_length(str(lo), str(hi))
    return "|".join(parts)


def number_regex(low: float, high: float, integer: bool = True) -> str:
    """The exact answers allowed in [low, high]: integers, or up to two decimals."""
    lo, hi = math.ceil(low), math.floor(high)
    ints = _int_range_regex(lo, hi)
    if integer:
        return f"({ints})"
    if lo == hi:
        return f"({ints})"
    below = _int_range_regex(lo, hi - 1)
    return rf"(({below})(\.[0-9]{{1,2}})?|{hi})"


def number_gbnf(low: float, high: float, integer: bool = True, leading_space: bool = True) -> str:
    """The language of ``number_regex`` as a GBNF grammar (llama.cpp's constrained decoding).

    Args:
        low, high: the allowed range.
        integer: integers only, or up to two decimals.
        leading_space: allow one space before the number, so a completion prompt that ends
            with a colon can continue with its most natural token (engines strip it).
    """
    body = _regex_to_gbnf(number_regex(low, high, integer))
    space = '" "? ' if leading_space else ""
    return f"root ::= {space}number\nnumber ::= {body}\n"


_TOKEN = re.compile(r"\(\?:|\\\.|\[[^\]]*\](?:\{\d+(?:,\d+)?\})?|[()|?]|\{\d+(?:,\d+)?\}|\d")


def _regex_to_gbnf(regex: str) -> str:
    """Translate the small regex subset ``number_regex`` emits (digits, classes, groups,
    alternation, ``?``, ``{n}``/``{m,n}``, ``\\.``) into a GBNF expression."""
    out: list[str] = []
    pos = 0
    for match in _TOKEN.finditer(regex):
        if match.start() != pos:
            raise ValueError(f"cannot translate {regex!r} at {pos}")
        token = match.group()
        pos = match.end()
        if token == "(?:":
            out.append("(")
        elif token == "\\.":
            out.append('"."')
        elif token.isdigit():
            out.append(f'"{token}"')
        elif token == "|":
            out.append(" | ")
        elif token in "()?" or token.startswith("["):
            out.append(token)
        else:  # a bare repetition such as {2}
            out.append(token)
        if token not in ("(?:", "(", "|") and not out[-1].endswith(" "):
            out.append(" ")
    if pos != len(regex):
        raise ValueError(f"cannot translate {regex!r} at {pos}")
    return re.sub(r" +([)?{])", r"\1", re.sub(r" {2,}", " ", "".join(out))).strip()


def parse_answers(text: pl.Series, low: float, high: float, integer: bool = True) -> pl.DataFrame:
    """Parse answers in bulk. Returns columns ``guess`` (Float64, null when invalid),
    ``valid`` (Boolean) and ``error`` (why an answer was rejected, else null).

    An answer is valid when it holds exactly one number, inside [low, high], and an
    integer when the game asks for integers.
    """
    frame = pl.DataFrame({"text": text.cast(pl.String)}).with_columns(
        n=pl.col("text").fill_null("").str.count_matches(NUMBER),
        value=pl.col("text").str.extract(f"({NUMBER})", 1).cast(pl.Float64),
    )
    error = (
        pl.when(pl.col("n") == 0)
        .then(pl.lit("no number in answer"))
        .when(pl.col("n") > 1)
        .then(pl.lit("several numbers in answer"))
        .when((pl.col("value") < low) | (pl.col("value") > high))
        .then(pl.lit(f"out of range [{_fmt(low)}, {_fmt(high)}]"))
    )
    if integer:
        error = error.when(pl.col("value") != pl.col("value").round(0)).then(pl.lit("not an integer"))
    frame = frame.with_columns(error=error.otherwise(pl.lit(None, pl.String)))
    return frame.select(
        guess=pl.when(pl.col("error").is_null()).then(pl.col("value")),
        valid=pl.col("error").is_null(),
        error=pl.col("error"),
    )


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
