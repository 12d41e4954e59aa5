"""Every config in experiments/ validates exactly as shipped: engine blocks (vLLM on a GPU
included) are checked here, since the tiny-size runs (test_experiments_configs.py) play the
paper's configs on the laptop profile's models and the others but the quickstart and models.yaml
on simulated stand-ins."""

from __future__ import annotations

import pytest
import yaml

from design.loading import load_config
from tests.conftest import EXPERIMENT_CONFIGS as CONFIGS
from tests.conftest import REPO

pytestmark = pytest.mark.quick


def _engine_kinds(engines: list[dict]) -> list[str]:
    kinds = []
    for engine in engines:
        if engine.get("kind") == "mixture":
            kinds += _engine_kinds([c["engine"] for c in engine["components"]])
        else:
            kinds.append(engine["kind"])
    return kinds


@pytest.mark.parametrize("config", CONFIGS)
def test_config_validates_as_shipped(config):
    data = yaml.safe_load((REPO / config).read_text())
    cfg = load_config(REPO / config)
    arms = cfg.arms_list()
    shipped = data.get("arms", {}).get("engines")
    if shipped:
        # Every engine block of the file became the engine spec of its kind, with its settings.
        specs = [a.engine for a in arms]
        assert sorted({s.kind for s in specs}) == sorted({e["kind"] for e in shipped})
        for block, spec in zip(shipped, cfg.arms.engines):
            dumped = spec.model_dump(mode="json")
            assert all(dumped[k] == v for k, v in block.items() if k != "components" and not isinstance(v, (list, dict))), block
    assert len(arms) >= 1 and cfg.population.size > 0


def test_the_shipped_configs_cover_every_engine_kind():
    kinds = set()
    for config in CONFIGS:
        kinds |= set(_engine_kinds(yaml.safe_load((REPO / config).read_text()).get("arms", {}).get("engines", [])))
    assert {"llamacpp", "simulated", "vllm"} <= kinds  # the vLLM blocks are checked above, as shipped
