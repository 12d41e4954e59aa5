"""The seed paper's own figures in ``llm_reference``: its average guesses per model, prompt and round.

The figures of *Very Large-Scale Multi-Agent Simulation in AgentScope* (arXiv 2407.17789v2) are
written out here once more, as the paper prints them, and each row of the view (a real DuckDB
file) must hold exactly one of them, with its prompt mode, round, model and source; which served
model names each row's ``model_match`` takes for its own, and which it must not, is checked in
DuckDB's regular expressions, as the report's query matches them; a warehouse whose view predates
these rows shows them once opened.
"""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from core.game import GameRule
from tests.warehouse.conftest import fill
from warehouse.llm_references import LLM_REFERENCE, PAPER_SOURCE
from warehouse.store import Warehouse

pytestmark = pytest.mark.quick

MODES = ("basic", "cot", "cot_rational", "cot_strategic")  # the paper's P1, P2, P3, P4
ROUND_ONE = {
    "Llama3-8B": (55.89, 49.85, 47.84, 47.09),
    "Llama3-70B": (50.30, 34.18, 36.11, 17.15),
    "MistralAI-8x7B": (36.63, 37.57, 35.19, 24.42),
    "MistralAI-8x22B": (31.69, 19.89, 7.62, 7.94),
    "Qwen2-7B": (66.96, 32.57, 26.45, 28.38),
    "Qwen2-72B": (50.56, 19.15, 8.15, 8.85),
}
FIVE_ROUNDS = {"basic": (50.56, 42.94, 35.30, 29.95, 25.16), "cot": (19.15, 11.06, 6.11, 3.43, 2.02)}  # Qwen2-72B
EXPECTED = {(model, mode, 1): value for model, values in ROUND_ONE.items() for mode, value in zip(MODES, values)} | {
    ("Qwen2-72B", mode, r): value for mode, values in FIVE_ROUNDS.items() for r, value in enumerate(values, start=1)}
#: Served names of each model (Hugging Face, Ollama, Groq, GGUF files), and of models it is not.
SERVED = {
    "Llama3-8B": ["meta-llama/Meta-Llama-3-8B-Instruct", "llama3:8b", "llama3-8b-8192", "Meta-Llama-3-8B-Instruct.Q4_K_M.gguf"],
    "Llama3-70B": ["meta-llama/Meta-Llama-3-70B-Instruct", "llama3:70b", "llama3-70b-8192"],
    "MistralAI-8x7B": ["mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral:8x7b", "mixtral-8x7b-32768"],
    "MistralAI-8x22B": ["mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral:8x22b"],
    "Qwen2-7B": ["Qwen/Qwen2-7B-Instruct", "qwen2:7b", "qwen2-7b-instruct-q4_k_m.gguf"],
    "Qwen2-72B": ["Qwen/Qwen2-72B-Instruct", "qwen2:72b", "Qwen2-72B-Instruct-GGUF"],
}
NONE = ["meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct", "llama3.2:3b", "Qwen/Qwen2.5-72B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct", "qwen2:1.5b", "mistralai/Mistral-7B-Instruct-v0.3", "gemma-3-270m", "gpt-4o-mini"]


@pytest.fixture(scope="module")
def view(tmp_path_factory) -> pl.DataFrame:
    warehouse = fill(tmp_path_factory.mktemp("paper") / "paper.duckdb", [(0, "cot", "Qwen/Qwen2-72B-Instruct", GameRule(ratio="2/3"))])
    return warehouse.query("SELECT * FROM llm_reference WHERE source = ? ORDER BY model, prompt_mode, round", [PAPER_SOURCE])


def test_every_figure_of_the_paper_is_one_row_with_its_model_prompt_and_round(view):
    assert view.height == len(EXPECTED) == 6 * 4 + 2 * 4
    assert {(r["model"], r["prompt_mode"], r["round"]): r["value"] for r in view.iter_rows(named=True)} == EXPECTED
    assert len([r for r in LLM_REFERENCE if r.source == PAPER_SOURCE]) == len(EXPECTED)


def test_each_row_names_its_source_and_says_what_it_does_not_state(view):
    for row in view.iter_rows(named=True):
        assert row["citation"].startswith("Pan, Gao, Xie, Chen, Wei, Li, Ding, Wen & Zhou (2024), Very Large-Scale "
                                          "Multi-Agent Simulation in AgentScope, arXiv 2407.17789v2"), row
        assert row["url"] == "https://arxiv.org/abs/2407.17789v2"
        assert (row["ratio"], row["offset"], row["low"], row["high"], row["statistic"], row["players"]) == ("2/3", 0, 0, 100, "mean", 1000)
        assert (row["model_id"], row["runs"], row["n"], row["run_means"]) == (None, None, None, None)  # not stated
        prompt = "P" + str(MODES.index(row["prompt_mode"]) + 1)
        assert f"prompt {prompt}:" in row["setting"]
        assert f"of {row['model']} under {prompt} in round {row['round']} of its " in row["derivation"]
        assert "arXiv 2407.17789v2" in row["derivation"] and "runs, n and run_means are NULL" in row["derivation"]
        experiment = "five-round experiment" if row["round"] > 1 else "models × prompts experiment"
        assert f"its {experiment}" in row["derivation"]


def test_each_model_match_takes_its_served_names_and_no_others(view):
    names = [(model, name) for model, served in SERVED.items() for name in served] + [(None, name) for name in NONE]
    with duckdb.connect() as con:
        con.register("refs", view.select("model", "model_match").unique().to_arrow())
        con.register("names", pl.DataFrame(names, schema=["own", "name"], orient="row").to_arrow())
        matched = con.execute("SELECT n.name, list(r.model) FROM names n LEFT JOIN refs r "
                              "ON regexp_matches(n.name, r.model_match, 'i') GROUP BY ALL").fetchall()
    assert {name: [m for m in models if m] for name, models in matched} == {
        name: [own] if own else [] for own, name in names}


def test_a_warehouse_whose_view_predates_the_papers_rows_shows_them_when_opened(tmp_path):
    path = tmp_path / "older.duckdb"
    fill(path, [(0, "basic", "fixture/a", GameRule(ratio="2/3"))], rounds=1)
    with duckdb.connect(str(path)) as con:  # the view as an older keynes wrote it: GAMA-Bench's pools only
        sql = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'llm_reference'").fetchone()[0]
        body = sql.split(" AS ", 1)[1].rstrip(";")
        con.execute(f"CREATE OR REPLACE VIEW llm_reference AS SELECT * FROM ({body}) WHERE source LIKE 'GAMA%'")
        con.execute("COMMENT ON VIEW llm_reference IS 'GAMA-Bench only [keynes:000000000000]'")
        assert con.execute("SELECT count(*) FROM llm_reference").fetchone() == (13,)
    reopened = Warehouse(path)
    assert reopened.query("SELECT count(*) AS n FROM llm_reference WHERE source = ?", [PAPER_SOURCE])["n"][0] == len(EXPECTED)
