"""Shard sizes: keynes's own (``design.shards``) unless the user sets one, the size a resumed
experiment keeps, ids that do not move, and what ``keynes plan`` adds for shards."""

from __future__ import annotations

import math

import pytest

from design.config import ConfigError
from design.loading import load_config
from design.plan import Calibration, with_shards
from design.shards import MAX_SHARD, SHARDS_PER_ACTOR, auto_shard_size, engine_batch, shard_size, sized
from tasks.store import begin_experiment, open_warehouse, recorded_shard_size
from tests.conftest import QUICKSTART

pytestmark = pytest.mark.quick

SCALED = ["population.size=20000", "game.rounds=1", "arms.prompts=[basic]"]


def test_keynes_sizes_shards_by_population_actors_and_engine():
    # A few shards per actor; at least one batch of the engine's unless an actor would go without.
    assert auto_shard_size(20_000, 2) == 20_000 // (2 * SHARDS_PER_ACTOR) == 2500
    assert auto_shard_size(20_000, 2, batch=8) == 2504  # a whole number of batches
    assert auto_shard_size(30, 2, batch=8) == 8
    assert auto_shard_size(10, 2, batch=8) == 5  # two actors, one shard each
    assert auto_shard_size(1, 4, batch=8) == 1
    assert auto_shard_size(1_000, 2, batch=100_000) == 500
    assert auto_shard_size(10_000_000, 4) == MAX_SHARD


def test_the_quickstart_without_a_pin_still_shows_progress_on_30_agents():
    cfg = load_config(QUICKSTART)
    assert cfg.workers.shard_size is None
    assert engine_batch(cfg.arms.engines) == 8  # llama.cpp's chain-of-thought streams
    size = shard_size(cfg)
    shards = math.ceil(cfg.population.size / size)
    assert (size, shards) == (8, 4) and shards >= 2 * cfg.workers.actors
    # Scaled to 20,000 agents: 8 shards, not the 4,000 of the old pin.
    assert math.ceil(20_000 / shard_size(load_config(QUICKSTART, SCALED))) == 8


def test_a_number_is_the_user_s_and_auto_or_null_is_keynes_s():
    assert load_config(QUICKSTART, ["workers.shard_size=5"]).workers.shard_size == 5
    for value in ("auto", "AUTO", "null"):
        assert load_config(QUICKSTART, [f"workers.shard_size={value}"]).workers.shard_size is None
    for value in ("0", "-3", "big"):
        with pytest.raises(ConfigError, match=r"^workers\.shard_size: "):
            load_config(QUICKSTART, [f"workers.shard_size={value}"])


def test_shard_size_leaves_the_experiment_id_as_it_was():
    # The quickstart's id, whatever its shard size: the id of warehouses whose config pinned one.
    ids = {load_config(QUICKSTART, [f"workers.shard_size={v}"]).experiment_id for v in ("5", "1000", "auto")}
    assert ids == {load_config(QUICKSTART).experiment_id} == {"quickstart-f0ab3529"}


def test_a_resumed_experiment_keeps_the_size_it_started_with():
    cfg = load_config(QUICKSTART, SCALED)
    assert shard_size(cfg) == 2504
    # The first run recorded 2,504; the user now runs it on 8 actors (keynes alone would pick 632).
    more = load_config(QUICKSTART, [*SCALED, "workers.actors=8"])
    assert shard_size(more) == 632 and shard_size(more, recorded=2504) == 2504
    assert sized(more, recorded=2504).workers.shard_size == 2504 and sized(more, 2504).experiment_id == cfg.experiment_id
    # A size the user sets is theirs, recorded or not.
    assert shard_size(load_config(QUICKSTART, [*SCALED, "workers.shard_size=1000"]), recorded=2504) == 1000


def test_the_warehouse_hands_back_the_recorded_size(tmp_path):
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    assert recorded_shard_size(warehouse, "nothing-yet", read_only=True) is None  # no file yet
    cfg = sized(load_config(QUICKSTART, SCALED))
    begin_experiment(warehouse, cfg.experiment_id, cfg.name, cfg.model_dump(mode="json"), cfg.config_hash, cfg.seed, 20_000)
    assert recorded_shard_size(warehouse, cfg.experiment_id) == 2504
    assert recorded_shard_size(warehouse, "another") is None
    # A rerun records nothing new: the first run's size stays.
    again = sized(load_config(QUICKSTART, [*SCALED, "workers.shard_size=7"]))
    begin_experiment(warehouse, again.experiment_id, again.name, again.model_dump(mode="json"), again.config_hash, again.seed, 20_000)
    assert recorded_shard_size(warehouse, cfg.experiment_id, read_only=True) == 2504


def test_the_plan_counts_each_shard_on_the_actors_and_each_commit_in_the_driver():
    cal = Calibration(3, 0.2, 2, 60, 60, shard_s=0.02, commit_s=0.1)
    small = load_config(QUICKSTART, [*SCALED, "workers.shard_size=5"])  # 4,000 shards on 2 actors
    # The driver commits about one shard per actor at a time: 2,000 commits. Each round also
    # commits its last shard, reads what is stored before and loads its guesses after.
    assert with_shards(3.0, small, 20_000, 1, cal) == pytest.approx(2000 * 0.1 + 3 * 0.1)
    # Eight shards: the actors' side.
    default = load_config(QUICKSTART, SCALED)
    assert with_shards(3.0, default, 20_000, 1, cal) == pytest.approx(3.0 + 8 * 0.02 / 2 + 3 * 0.1)
    # Two rounds: twice each.
    assert with_shards(6.0, default, 20_000, 2, cal) == pytest.approx(6.0 + 2 * 8 * 0.02 / 2 + 2 * 3 * 0.1)
