"""Published results of human players, each row with its source, for the ``human_reference`` view.

Reports draw the first-round results beside an arm that plays the same game, and show the
cognitive-hierarchy τ fitted to human subject pools beside an arm's own τ. Only figures
printed in the cited papers are listed; a game the paper does not state exactly is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

_NAGEL = "Nagel (1995), AER 85(5): 1313–1326"
_CHC = "Camerer, Ho & Chong (2004), QJE 119(3): 861–898, Table II"


@dataclass(frozen=True)
class Reference:
    """One published result: a subject pool's first-round play of one game.

    ``kind`` is ``result`` (observed mean and median) or ``cognitive hierarchy`` (a τ fitted
    to the pool's mean, with the paper's bootstrapped 90 % interval in ``tau_low``/``tau_high``).
    """

    kind: str
    source: str
    pool: str
    ratio: str
    offset: float
    mean: float | None
    median: float | None = None
    tau: float | None = None
    tau_low: float | None = None
    tau_high: float | None = None
    n: int | None = None
    low: float = 0.0
    high: float = 100.0
    round: int = 1


def _ch(pool: str, data: str, ratio: str, n: int, mean: float, tau: float, low: float, high: float, offset: float = 0.0) -> Reference:
    return Reference("cognitive hierarchy", f"{_CHC} (data: {data})", pool, ratio, offset, mean, tau=tau, tau_low=low,
                     tau_high=high, n=n)


HUMAN_REFERENCE: list[Reference] = [
    # Nagel (1995), first period of each treatment, numbers in [0, 100].
    Reference("result", f"{_NAGEL}, p = 1/2", "students (Frankfurt, Bonn)", "1/2", 0.0, 27.05, 17.0),
    Reference("result", f"{_NAGEL}, p = 2/3", "students (Frankfurt, Bonn)", "2/3", 0.0, 36.73, 33.0),
    Reference("result", f"{_NAGEL}, p = 4/3", "students (Frankfurt, Bonn)", "4/3", 0.0, 60.12),
    # Camerer, Ho & Chong (2004), Table II: τ chosen so that the CH mean matches the pool's
    # mean, in games with numbers in [0, 100]; rows of two- and three-player games, and of
    # games whose rule the table does not state, are left out.
    _ch("p = 0.7", "Ho, Camerer & Weigelt 1998", "7/10", 69, 38.9, 1.0, 0.5, 1.6),
    _ch("p = 0.9", "Ho, Camerer & Weigelt 1998", "9/10", 67, 49.4, 0.1, 0.1, 1.5),
    _ch("0.7 × (mean + 18)", "Nagel 1998", "7/10", 34, 49.5, 0.2, 0.0, 1.0, offset=12.6),
    _ch("1/2 of the mean", "Nagel 1998", "1/2", 48, 26.7, 1.5, 1.1, 1.9),
    _ch("Caltech board", "Camerer", "2/3", 73, 42.6, 0.5, 0.1, 0.9),
    _ch("CEOs", "Camerer", "2/3", 20, 37.9, 1.0, 0.3, 1.8),
    _ch("German students", "Nagel 1995", "2/3", 66, 37.2, 1.1, 0.7, 1.5),
    _ch("80-year-olds", "Kovalchik et al.", "2/3", 33, 37.0, 1.1, 0.6, 1.7),
    _ch("U.S. high school", "Camerer", "2/3", 52, 32.5, 1.6, 1.1, 2.2),
    _ch("Economics PhDs", "Camerer", "2/3", 16, 27.4, 2.3, 1.4, 3.5),
    _ch("Portfolio managers", "Camerer", "2/3", 26, 24.3, 2.8, 2.0, 3.7),
    _ch("Caltech students", "Camerer", "2/3", 42, 23.0, 3.0, 2.7, 3.8),
    _ch("Newspaper contests", "Nagel 1998", "2/3", 7884, 23.0, 3.0, 3.0, 3.1),
    _ch("Game theorists", "Nagel 1998", "2/3", 136, 19.1, 3.7, 2.8, 4.7),
]


def sql_values(rows: list, columns: tuple[str, ...]) -> str:
    """Dataclass rows as a SQL ``VALUES`` list, each row's attributes in the order of ``columns``
    (a tuple becomes a list)."""

    def lit(v: object) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        if isinstance(v, tuple):
            return "[" + ", ".join(lit(x) for x in v) + "]"
        return repr(v)

    return ", ".join("(" + ", ".join(lit(getattr(r, c)) for c in columns) + ")" for r in rows)


def values_sql() -> str:
    """The rows as a SQL ``VALUES`` list, in the column order of ``COLUMNS``."""
    return sql_values(HUMAN_REFERENCE, COLUMNS)


#: Columns of the view, in order.
COLUMNS = ("kind", "source", "pool", "ratio", "offset", "low", "high", "round", "n", "mean", "median", "tau", "tau_low", "tau_high")
