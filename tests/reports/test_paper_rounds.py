"""The report's data for the seed paper beside each arm: its figures for the arm's prompt mode, round by round.

A warehouse filled through the store API over five rounds holds a chain-of-thought Qwen2-72B arm
(the paper's model, with five rounds under P2), a basic Llama 3 8B arm, a ``cot_rational`` arm of
another model, a ``persona`` arm (a prompt the paper did not use) and an arm of a game the paper
did not play. The page itself is checked in Chromium in ``test_llm_pools.py``.
"""

from __future__ import annotations

import polars as pl
import pytest

from core.game import GameRule
from reports.data import ReportData
from reports.pools import arm_paper
from tests.warehouse.conftest import EXPERIMENT, fill

pytestmark = pytest.mark.quick

RULE = GameRule(ratio="2/3", rounds=5)
ARMS = [
    (0, "cot", "Qwen/Qwen2-72B-Instruct", RULE),
    (1, "basic", "meta-llama/Meta-Llama-3-8B-Instruct", RULE),
    (2, "cot_rational", "fixture/a", RULE),
    (3, "persona", "gemma-3-270m", RULE),
    (4, "cot", "Qwen/Qwen2-72B-Instruct", GameRule(ratio="1/2", offset=5, rounds=5)),
]
PAPER_MODELS = ["Llama3-8B", "Llama3-70B", "MistralAI-8x7B", "MistralAI-8x22B", "Qwen2-7B", "Qwen2-72B"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> ReportData:
    return ReportData(fill(tmp_path_factory.mktemp("paper") / "paper.duckdb", ARMS, rounds=5), EXPERIMENT)


def paper(data: ReportData, arm: int) -> pl.DataFrame:
    return data.paper_rounds.filter(pl.col("arm") == arm)


def test_a_cot_arm_of_qwen2_72b_stands_beside_p2_in_every_round_its_model_marked(data):
    rows = paper(data, 0)
    first = rows.filter(pl.col("round") == 1)
    assert first.select("model", "value").rows() == list(zip(PAPER_MODELS, (49.85, 34.18, 37.57, 19.89, 32.57, 19.15)))
    assert first.filter(pl.col("same_model"))["model"].to_list() == ["Qwen2-72B"]
    later = rows.filter(pl.col("round") > 1)
    assert later.select("round", "model", "value", "same_model").rows() == [
        (2, "Qwen2-72B", 11.06, True), (3, "Qwen2-72B", 6.11, True), (4, "Qwen2-72B", 3.43, True), (5, "Qwen2-72B", 2.02, True)]
    # beside each figure, the arm's own mean of that round (round_summary's)
    means = data.rounds.filter(pl.col("arm") == 0).select(pl.col("round").cast(pl.Int32), "mean", "n_valid")
    assert rows.select("round", "mean", "n_valid").unique(maintain_order=True).rows() == means.rows()


def test_a_basic_arm_gets_p1_and_its_own_model_marked(data):
    rows = paper(data, 1)
    assert rows.filter(pl.col("round") == 1).select("model", "value").rows() == list(
        zip(PAPER_MODELS, (55.89, 50.30, 36.63, 31.69, 66.96, 50.56)))
    assert rows.filter(pl.col("same_model"))["model"].unique().to_list() == ["Llama3-8B"]
    # the paper's later rounds are Qwen2-72B's: beside this arm as figures of another model
    assert rows.filter(pl.col("round") > 1).select("round", "model", "value", "same_model").rows() == [
        (2, "Qwen2-72B", 42.94, False), (3, "Qwen2-72B", 35.30, False), (4, "Qwen2-72B", 29.95, False), (5, "Qwen2-72B", 25.16, False)]


def test_a_p3_arm_has_round_one_only_and_no_mark(data):
    rows = paper(data, 2)
    assert rows.filter(pl.col("round") == 1).select("model", "value").rows() == list(
        zip(PAPER_MODELS, (47.84, 36.11, 35.19, 7.62, 26.45, 8.15)))
    assert rows.filter(pl.col("round") > 1).select("round", "model").rows() == [(r, None) for r in range(2, 6)]
    assert not rows["same_model"].any()


def test_a_prompt_the_paper_did_not_use_gets_one_line_and_another_game_nothing(data):
    assert paper(data, 3)["model"].is_null().all() and paper(data, 3).height == 5
    (line,) = arm_paper(data, 3)
    assert line.object == ("The seed paper (Pan et al. 2024, arXiv 2407.17789v2) prints no average guess for prompt mode "
                           "persona; its figures are for basic (P1), cot (P2), cot_rational (P3), cot_strategic (P4).")
    assert paper(data, 4).is_empty() and arm_paper(data, 4) == []
