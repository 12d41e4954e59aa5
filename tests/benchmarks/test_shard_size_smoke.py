"""benchmarks/shard_size.py at a tiny size (40 Gemma agents; pinned shards of 10 and 40, no small
one: at 40 agents it is one more pinned run): every run's row holds the size it recorded and the
shards it committed, keynes's own size is the one ``design.shards`` gives, and the summary lines
are the rows' ratios."""

from __future__ import annotations

import math
import re

import pytest

from design.loading import load_config
from design.shards import shard_size
from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark
from tests.conftest import QUICKSTART

AGENTS = 40
ROW = rf"^  (default|[\d,]+|[\d,]+ \(small\))" + rf"\s+({NUMBER})" * 8 + "$"


@pytest.fixture(scope="module")
def printed() -> str:
    out = run_benchmark("shard_size.py", "--agents", str(AGENTS), "--pinned", "10,40", "--small", "0", timeout=1800)
    print(out)
    return out


@pytest.mark.slow
@pytest.mark.llm
def test_each_run_played_the_shards_its_size_makes(printed):
    rows = {label: [float(x.replace(",", "")) for x in rest] for label, *rest in re.findall(ROW, printed, re.MULTILINE)}
    assert list(rows) == ["default", "10", "40"], printed
    # keynes's own size, as the config resolves it (the run recorded it in the warehouse)
    keynes_size = shard_size(load_config(QUICKSTART, [f"population.size={AGENTS}", "game.rounds=1", "arms.prompts=[basic]"]))
    assert rows["default"][0] == keynes_size == 8
    assert [rows[label][0] for label in ("10", "40")] == [10, 40]
    for label, (size, shards, wall, round_s, play_s, plan_s, per_round, per_play) in rows.items():
        assert shards == math.ceil(AGENTS / size), (label, printed)
        assert 0 <= play_s <= round_s + 0.1 and round_s < wall and plan_s > 0, (label, printed)  # one shard: ~0.0 s
        assert ratio_of_printed(per_round, plan_s, round_s, half_step=0.05), (label, printed)
        assert ratio_of_printed(per_play, plan_s, play_s, half_step=0.05), (label, printed)


@pytest.mark.slow
@pytest.mark.llm
def test_the_summary_compares_the_default_with_the_best_pinned_run(printed):
    rows = {label: [float(x.replace(",", "")) for x in rest] for label, *rest in re.findall(ROW, printed, re.MULTILINE)}
    walls = {label: r[2] for label, r in rows.items()}
    label, top, bottom, ratio = re.search(rf"^default/best pinned \(([\d,]+)\): wall ({NUMBER}) s / ({NUMBER}) s = ({NUMBER})x "
                                          r"\(target: at most 1\.5x\)$", printed, re.MULTILINE).groups()
    # the best of the pinned sizes (not the small one), by wall
    assert label == min(("10", "40"), key=walls.get) and float(bottom) == walls[label] and float(top) == walls["default"]
    assert ratio_of_printed(float(ratio), float(top), float(bottom), half_step=0.05), printed
    for column, index in (("round", 6), ("play", 7)):
        (furthest,) = figures(rf"^plan/{column} furthest from 1: .+ ({NUMBER})x \(target: between 0\.5x and 2x\)$", printed)
        assert furthest in [r[index] for r in rows.values()], printed
