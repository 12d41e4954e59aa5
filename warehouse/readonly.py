"""Read-only queries as plain Python rows, and their CSV and JSON text: what ``keynes sql`` needs.

Only DuckDB is imported (no polars, pyarrow or pandera), so a query starts about as fast as
DuckDB itself. The file is opened the way every reader opens it (``WarehouseFile.connect``):
retried while a run commits, upgraded once if older. CSV cells are spelled as polars writes them.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from datetime import datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any

from warehouse.files import WarehouseError, WarehouseFile

__all__ = ["Rows", "WarehouseError", "query_rows"]

#: Decimal exponents written in fixed notation (others as 1e-7, 1e+16), as polars writes floats.
_FIXED_EXPONENTS = {"DOUBLE": range(-5, 16), "FLOAT": range(-6, 13)}
_QUOTED_WHEN = (",", '"', "\n", "\r")


@dataclass(frozen=True)
class Rows:
    """A query's result: column names, their DuckDB types, and the rows as Python values."""

    columns: list[str]
    types: list[str]
    values: list[tuple]

    def csv(self) -> str:
        """CSV with a header line: nulls empty, empty strings quoted, lists/structs/maps as JSON."""
        if not self.columns:
            return ""
        lines = [",".join(map(_quoted, self.columns))]
        lines += [",".join(_csv_cell(v, t) for v, t in zip(row, self.types)) for row in self.values]
        return "\n".join(lines) + "\n"

    def json(self) -> str:
        """One JSON array with an object per row; values JSON has no type for (timestamps,
        decimals, UUIDs) as their text."""
        return json.dumps([dict(zip(self.columns, row)) for row in self.values], default=str)


def query_rows(path: str | Path, sql: str) -> Rows:
    """Run ``sql`` on a read-only connection to the warehouse file at ``path``.

    Raises:
        WarehouseError: no such file, not a keynes warehouse, or held by a writer past the lock timeout.
        duckdb.Error: the SQL is wrong, or tries to write.
    """
    with WarehouseFile(path).connect(read_only=True) as con:
        relation = con.sql(sql)
        if relation is None:  # a statement without a result (SET, CHECKPOINT…)
            return Rows([], [], [])
        return Rows(list(relation.columns), [str(t) for t in relation.types], relation.fetchall())


def _quoted(text: str) -> str:
    """A CSV field: quoted when it holds a separator, quote or line break, or is empty (not null)."""
    if text and not any(c in text for c in _QUOTED_WHEN):
        return text
    return '"' + text.replace('"', '""') + '"'


def _csv_cell(value: Any, type_: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float_text(value, "FLOAT" if type_ == "FLOAT" else "DOUBLE")
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f%z")
    if isinstance(value, time):
        return value.strftime("%H:%M:%S.%f") + "000"  # nanoseconds
    if isinstance(value, (list, tuple, dict)):
        return _quoted(json.dumps(value, default=str))
    return _quoted(str(value))


def _float_text(value: float, kind: str) -> str:
    """The shortest text that reads back as the same DOUBLE (or FLOAT: 32 bits): 0.1, 100.0,
    0.00001, 1e-7, 1e+16."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(value)
    if kind == "FLOAT":  # a 32-bit value, widened by DuckDB: its own shortest digits
        text = next(t for p in range(1, 10) if _single(float(t := f"{value:.{p}g}")) == value)
    sign, digits, exponent = Decimal(text).normalize().as_tuple()
    power = len(digits) + exponent - 1
    if power in _FIXED_EXPONENTS[kind]:
        fixed = format(Decimal(text).normalize(), "f")
        return fixed if "." in fixed else fixed + ".0"
    mantissa = "".join(map(str, digits))
    mantissa = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'+' if power > 0 else ''}{power}"


def _single(value: float) -> float:
    """``value`` rounded to a 32-bit float."""
    return struct.unpack("f", struct.pack("f", value))[0]
