"""The analysis views are filled or say why not: a stored round without its τ fit or paired test
shows a ``status`` row instead of silently missing from ``cognitive_hierarchy_fit`` and
``paired_comparisons``."""

from __future__ import annotations

import pytest

from tests.warehouse.conftest import ARMS, ROUNDS, fill
from warehouse.analyses import refresh
from warehouse.depth_views import PENDING

pytestmark = pytest.mark.quick


def statuses(wh, view: str) -> list[tuple]:
    key = "run_id, round" if view == "cognitive_hierarchy_fit" else "round"
    return wh.query(f"SELECT DISTINCT {key}, status FROM {view} WHERE attribute IS NULL OR status <> 'computed' ORDER BY ALL"
                    if view == "cognitive_hierarchy_fit" else
                    f"SELECT DISTINCT {key}, status FROM {view} ORDER BY ALL").rows()


def test_stored_rounds_without_analyses_say_so_and_are_filled_by_refresh(tmp_path):
    wh = fill(tmp_path / "w.duckdb")
    runs = [f"{r}" for (r,) in wh.query("SELECT run_id FROM runs ORDER BY run_id").rows()]
    assert statuses(wh, "cognitive_hierarchy_fit") == [(r, k, PENDING) for r in runs for k in range(1, ROUNDS + 1)]
    assert statuses(wh, "paired_comparisons") == [(k, PENDING) for k in range(1, ROUNDS + 1)]
    refresh(wh)
    assert statuses(wh, "cognitive_hierarchy_fit") == [(r, k, "computed") for r in runs for k in range(1, ROUNDS + 1)]
    assert statuses(wh, "paired_comparisons") == [(k, "computed") for k in range(1, ROUNDS + 1)]


def test_one_arm_has_nothing_to_compare(tmp_path):
    wh = fill(tmp_path / "w.duckdb", ARMS[:1])
    refresh(wh)
    assert statuses(wh, "paired_comparisons") == [(k, "one arm: nothing to compare") for k in range(1, ROUNDS + 1)]


def test_arms_that_differ_in_two_factors_are_not_compared_and_the_view_says_why(tmp_path):
    wh = fill(tmp_path / "w.duckdb", [ARMS[0], ARMS[2]])  # another model and another game
    refresh(wh)
    assert statuses(wh, "paired_comparisons") == [(k, "no two arms differ in exactly one factor") for k in range(1, ROUNDS + 1)]


def test_a_round_not_yet_stored_by_every_arm_is_waiting(tmp_path):
    wh = fill(tmp_path / "w.duckdb", ARMS[:2])
    with wh.transaction() as con:
        con.execute("DELETE FROM rounds WHERE run_id LIKE '%-arm1' AND round = ?", [ROUNDS])
    refresh(wh)
    last = statuses(wh, "paired_comparisons")[-1]
    assert last == (ROUNDS, "waiting: 1 of 2 arms have not stored this round yet")
