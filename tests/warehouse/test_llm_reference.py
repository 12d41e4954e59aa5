"""The ``llm_reference`` view: GAMA-Bench's pools with their citations, and which arm plays which pool's model.

The values are GAMA-Bench's round-1 means computed from its raw results (docs/warehouse.md says
how); here they are checked against the data module, against their own per-game means, and
against a record of the expected means kept here to one decimal, which each must round to. The
seed paper's rows are checked in ``test_paper_reference.py``.
"""

from __future__ import annotations

import polars as pl
import pytest

from core.game import GameRule
from tests.warehouse.conftest import fill
from warehouse.llm_references import COLUMNS, LLM_REFERENCE, PAPER_SOURCE
from warehouse.report_queries import llm_rows

pytestmark = pytest.mark.quick

#: GAMA-Bench's round-1 means to one decimal, by the model's printed name: what the view's values must round to.
QUOTED = {"Gemini-1.5-Pro": 29.2, "GPT-4o": 30.3, "Mixtral-8x22B": 33.3, "LLaMA-3.1-405B": 35.5, "Mixtral-8x7B": 40.0,
          "Qwen-2-72B": 40.1, "LLaMA-3.1-70B": 40.7, "GPT-4-0125": 42.1, "LLaMA-3.1-8B": 46.3, "GPT-3.5-Turbo": 50.0,
          "Gemini-1.0-Pro": 59.8}
GAMA = [r for r in LLM_REFERENCE if r.source == "GAMA-Bench (Huang et al. 2025)"]
RULE = GameRule(ratio="2/3", rounds=3)
ARMS = [
    (0, "basic", "Qwen/Qwen2-72B-Instruct", RULE),
    (1, "cot", "gemma-3-270m", RULE),
    (2, "basic", "Qwen/Qwen2.5-72B-Instruct", RULE),  # another model: no pool of its own
    (3, "basic", "gpt-4o-mini", RULE),  # not GPT-4o
    (4, "basic", "meta-llama/Meta-Llama-3.1-8B-Instruct", GameRule(ratio="1/2", offset=5, rounds=3)),  # no pool played 1/2
]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    return fill(tmp_path_factory.mktemp("llm") / "llm.duckdb", ARMS)


def test_select_star_lists_gama_bench_round_one_means_with_citations(warehouse):
    view = warehouse.query("SELECT * FROM llm_reference WHERE source LIKE 'GAMA-Bench%'")
    assert tuple(view.columns) == COLUMNS
    data = pl.DataFrame([{c: list(getattr(r, c)) if c == "run_means" else getattr(r, c) for c in COLUMNS} for r in GAMA])
    assert view.height == len(GAMA) == 13 and len(LLM_REFERENCE) == 13 + 32  # the seed paper's: test_paper_reference.py
    assert view.select("model", "value", "n", "run_means").rows() == data.select("model", "value", "n", "run_means").rows()
    assert {m: round(v, 1) for m, v in view.filter(pl.col("model").is_in(list(QUOTED))).select("model", "value").rows()} == QUOTED
    for row in view.iter_rows(named=True):
        assert row["source"] == "GAMA-Bench (Huang et al. 2025)"
        assert "arXiv 2403.11807" in row["citation"] and "ICLR 2025" in row["citation"]
        assert row["url"].startswith("https://github.com/CUHK-ARISE/GAMABench/tree/41ebccf54869a462a1ba3820d6c616e02e3f6fd1/")
        # the value pools the per-game means of equal games: n guesses = players × runs
        assert (row["players"], row["runs"], row["n"], len(row["run_means"])) == (10, 5, 50, 5)
        assert row["value"] == pytest.approx(sum(row["run_means"]) / 5, abs=1e-9)
        assert f"/ 50 = {row['value']:g}" in row["derivation"]
        assert (row["ratio"], row["offset"], row["low"], row["high"], row["round"], row["statistic"]) == ("2/3", 0, 0, 100, 1, "mean")


def test_each_pool_matches_its_own_model_and_no_other(warehouse):
    # in DuckDB's regular expressions, as the report's query matches them
    pairs = warehouse.query("SELECT a.model, b.model AS other FROM llm_reference a, llm_reference b "
                            "WHERE regexp_matches(a.model_id, b.model_match, 'i') AND b.source = a.source").rows()
    assert sorted(pairs) == sorted((r.model, r.model) for r in GAMA)


def test_arms_get_the_pools_of_their_rule_and_the_mark_of_their_own_model(warehouse):
    rows = llm_rows(warehouse, ["views-0001"])
    assert rows.filter(pl.col("source") == PAPER_SOURCE).height == 4 * 32  # the seed paper's: test_paper_reference.py
    per_arm = {arm: g for (arm,), g in rows.filter(pl.col("source") != PAPER_SOURCE).group_by("arm")}
    assert set(per_arm) == {0, 1, 2, 3}  # arm 4 plays 1/2 of the mean + 5: no published pool
    assert all(g.height == 13 for g in per_arm.values())
    assert per_arm[0].filter(pl.col("same_model"))["model"].to_list() == ["Qwen-2-72B"]
    assert per_arm[0].filter(pl.col("same_model"))["value"].to_list() == [40.06]
    for arm in (1, 2, 3):
        assert not per_arm[arm]["same_model"].any(), arm
