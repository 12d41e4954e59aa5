"""Read-only rows for `keynes sql`: the same CSV and JSON as when the command went through polars.

polars (a real dependency) is the reference: every table and view of a filled warehouse, values
of every kind DuckDB returns, and random floats must be spelled as ``DataFrame.write_csv`` and
``to_dicts`` spelled them. Lists, structs and maps, which polars could not write as CSV, are
JSON text in their cell.
"""

from __future__ import annotations

import json
import random
import struct

import polars as pl
import pytest

from warehouse.readonly import _float_text, query_rows

pytestmark = pytest.mark.quick

EVERY_KIND = """
select 'a,b' as comma, 'he said "hi"' as quote, 'line
two' as newline, 'cr' || chr(13) || 'x' as cr, '' as empty, ' lead' as space, NULL::VARCHAR as null_text,
       'é ü' as accents, true as yes, false as no, NULL as nothing, 1.50::DECIMAL(5,2) as dec, 0::DECIMAL(18,10) as zero_dec,
       DATE '2026-01-02' as day, TIME '01:02:03.5' as clock, TIMESTAMP '2026-01-02 03:04:05.5' as naive,
       TIMESTAMPTZ '2026-01-02 03:04:05+00' as aware, 0.1::FLOAT as single, 1 / 3 as third, 1e-7 as tiny, 1e20 as huge,
       'nan'::DOUBLE as nan, '-inf'::DOUBLE as minus_inf, -0.0::DOUBLE as minus_zero,
       18446744073709551615::UBIGINT as ubig, '{"a": 1}'::JSON as js, 'x'::ENUM('x', 'y') as enum,
       '4c80dcd8-79f6-40ee-8c35-34f4f783321f'::UUID as uuid, -7::TINYINT as tiny_int
"""


def polars_spelling(path, sql: str) -> tuple[str, str]:
    """The CSV and JSON `keynes sql` printed when it went through polars."""
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        frame = pl.from_arrow(con.sql(sql).to_arrow_table())
    return frame.write_csv(), json.dumps(frame.to_dicts(), default=str)


def test_every_table_and_view_is_spelled_as_polars_spelled_it(filled):
    names = [r[0] for r in query_rows(filled.path, "select table_name from duckdb_tables() where not internal union all "
                                                   "select view_name from duckdb_views() where not internal").values]
    assert {"guesses", "personas", "round_summary", "convergence"} <= set(names)
    nested = []
    for name in names:
        rows = query_rows(filled.path, f"select * from {name} order by all")
        try:
            csv, as_json = polars_spelling(filled.path, f"select * from {name} order by all")
        except pl.exceptions.ComputeError:  # lists or maps: polars wrote no CSV of them
            nested.append(name)
            continue
        assert rows.csv() == csv, name
        assert rows.json() == as_json, name
    assert len(nested) < len(names) / 4, nested


def test_values_of_every_kind_are_spelled_as_polars_spelled_them(filled):
    rows = query_rows(filled.path, EVERY_KIND)
    csv, as_json = polars_spelling(filled.path, EVERY_KIND)
    assert rows.csv() == csv
    assert rows.json() == as_json
    # What that spelling is, for a reader of this test: nulls empty, empty strings quoted.
    assert rows.csv().splitlines()[1].startswith('"a,b","he said ""hi""","line')
    assert ',"",' in rows.csv() and ",true,false,," in rows.csv()


def test_lists_structs_and_maps_are_json_text_in_csv(filled):
    rows = query_rows(filled.path, "select [1, 2] as list, {'x': 'a,b'} as struct, map(['k'], ['v']) as map, NULL::INTEGER[] as none")
    assert rows.csv() == 'list,struct,map,none\n"[1, 2]","{""x"": ""a,b""}","{""k"": ""v""}",\n'
    assert json.loads(rows.json()) == [{"list": [1, 2], "struct": {"x": "a,b"}, "map": {"k": "v"}, "none": None}]


@pytest.mark.parametrize("kind", ["DOUBLE", "FLOAT"])
def test_floats_are_the_shortest_text_polars_writes(kind):
    rng = random.Random(7)
    values = [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(5000)]
    values += [rng.choice([1, -1]) * rng.random() * 10 ** rng.randint(-30, 30) for _ in range(5000)]
    values += [round(rng.random() * 100, rng.randint(0, 6)) for _ in range(2000)] + [0.0, -0.0, 1e-5, 9.99e-6, 1e15, 1e16]
    series = pl.Series(values, dtype=pl.Float32 if kind == "FLOAT" else pl.Float64)
    expected = pl.DataFrame({"x": series}).write_csv().splitlines()[1:]
    wrong = [(v, e, _float_text(v, kind)) for v, e in zip(series.to_list(), expected) if _float_text(v, kind) != e]
    assert not wrong, wrong[:5]
