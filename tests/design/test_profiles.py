"""Models profiles (``--models``): the config's LLM engines map onto the profile's in order of first
appearance, cycling; mixtures and arms that land on one engine merge; the backstory engine goes
with the arms' engines; the profile's ``set:`` applies before the command line's; variables are
read from the environment; every bad profile is refused in one line naming it."""

from __future__ import annotations

import pytest
import yaml

from design.config import ConfigError
from design.loading import load_config, run_overrides
from design.profiles import llm_engines, shipped
from tests.conftest import REPO
from tests.support.cli import invoke

pytestmark = pytest.mark.quick

PAPER = REPO / "experiments" / "paper"
GEMMA = {"kind": "llamacpp", "model": "gemma-3-270m"}
SMOLLM2 = {"kind": "llamacpp", "model": "smollm2-135m-instruct"}
URL = "http://127.0.0.1:9/v1"


def engines_of(cfg) -> list[dict]:
    return [e.model_dump(mode="json") for e in cfg.arms.engines]


def leaf(engine: dict) -> tuple[str, str]:
    return engine["kind"], engine["model"]


@pytest.fixture
def served(monkeypatch):
    """The served profile's variables: a URL, no model (each engine keeps its config's)."""
    monkeypatch.setenv("KEYNES_SERVED_URL", URL)
    monkeypatch.delenv("KEYNES_SERVED_MODEL", raising=False)
    monkeypatch.delenv("KEYNES_SERVED_PROMPT_FORMAT", raising=False)
    return monkeypatch


def test_the_hosted_profile_puts_a_paper_config_on_one_hosted_model_n_completions_a_request(monkeypatch):
    for name in ("KEYNES_HOSTED_URL", "KEYNES_HOSTED_MODEL", "KEYNES_HOSTED_KEY_ENV"):
        monkeypatch.delenv(name, raising=False)
    cfg = load_config(PAPER / "mixture.yaml", ["models=hosted"])
    (engine,) = engines_of(cfg)  # the mixture of three models is the one hosted model
    assert (engine["server"], engine["model"], engine["api_key_env"], engine["completions_per_request"]) == (
        "openai", "gpt-4o-mini", "OPENAI_API_KEY", 128)
    assert cfg.arms.max_answer_tokens == 16
    monkeypatch.setenv("KEYNES_HOSTED_MODEL", "my-model")
    monkeypatch.setenv("KEYNES_HOSTED_URL", URL)
    (engine,) = engines_of(load_config(PAPER / "temperature.yaml", ["models=hosted"]))
    assert (engine["model"], engine["base_url"]) == ("my-model", URL)


def test_the_shipped_profiles_are_not_experiment_configs():
    assert shipped() == ["hosted", "laptop", "served"]
    assert not list(PAPER.glob("laptop*")) and (REPO / "experiments" / "profiles" / "laptop.yaml").is_file()


def test_five_models_map_in_order_onto_the_laptops_two_cycling_and_identical_arms_merge():
    cfg = load_config(PAPER / "models_prompts.yaml", ["models=laptop"])
    # Llama-3-8B, Llama-3-70B, Qwen2-7B, Qwen2-72B, Mixtral → Gemma, SmolLM2, Gemma, SmolLM2, Gemma: two engines.
    assert [leaf(e) for e in engines_of(cfg)] == [leaf(GEMMA), leaf(SMOLLM2)]
    assert len(cfg.arms_list()) == 2 * 4
    assert cfg.population.size == 50 and cfg.arms.max_reasoning_tokens == 32 and cfg.workers.shard_size is None
    assert cfg.models == "laptop" and cfg.game.tolerance == 0.5


def test_a_mixture_keeps_a_component_per_engine_and_merges_those_that_coincide():
    (mixture,) = engines_of(load_config(PAPER / "mixture.yaml", ["models=laptop"]))
    assert [(leaf(c["engine"]), c["fraction"]) for c in mixture["components"]] == [(leaf(GEMMA), 0.666667), (leaf(SMOLLM2), 0.333333)]


def test_on_one_served_model_a_mixture_is_that_model_and_without_one_each_keeps_its_own(served):
    (three,) = engines_of(load_config(PAPER / "mixture.yaml", ["models=served"]))
    assert [c["engine"]["model"] for c in three["components"]] == [
        "meta-llama/Meta-Llama-3-8B-Instruct", "Qwen/Qwen2-7B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3"]
    assert {c["engine"]["base_url"] for c in three["components"]} == {URL}
    served.setenv("KEYNES_SERVED_MODEL", "qwen2")
    (one,) = engines_of(load_config(PAPER / "mixture.yaml", ["models=served"]))
    assert {k: one[k] for k in ("kind", "server", "base_url", "model", "prompt_format", "api_key_env", "shared_context")} == {
        "kind": "openai", "server": "vllm", "base_url": URL, "model": "qwen2", "prompt_format": "chat", "api_key_env": "VLLM_API_KEY",
        "shared_context": True}
    cfg = load_config(PAPER / "models_prompts.yaml", ["models=served"])
    assert len(cfg.arms.engines) == 1 and len(cfg.arms_list()) == 4 and cfg.population.size == 1000


def test_the_backstory_engine_goes_with_the_arms_engine_it_equals(served):
    cfg = load_config(PAPER / "education.yaml", ["models=laptop"])
    assert cfg.population.backstories.engine == cfg.arms.engines[0].model_dump(mode="json")
    assert leaf(cfg.population.backstories.engine) == leaf(GEMMA)
    data = yaml.safe_load((PAPER / "education.yaml").read_text())
    data["population"]["backstories"]["engine"] = {"kind": "vllm", "model": "Qwen/Qwen2-72B-Instruct"}
    assert [e["model"] for e in llm_engines(data)] == ["Qwen/Qwen2-7B-Instruct", "Qwen/Qwen2-72B-Instruct"]
    cfg = load_config({**data, "models": "laptop"})
    assert leaf(cfg.population.backstories.engine) == leaf(SMOLLM2) and leaf(engines_of(cfg)[0]) == leaf(GEMMA)


def test_simulated_engines_play_as_configured_and_the_command_line_comes_after_the_profile():
    shipped_engines = engines_of(load_config(PAPER / "baselines.yaml"))
    cfg = load_config(PAPER / "baselines.yaml", run_overrides(["population.size=7"], models="laptop"))
    assert engines_of(cfg) == shipped_engines and cfg.population.size == 7


def test_the_experiment_id_follows_the_engines_and_the_stored_config_names_the_profile(served):
    gpu, laptop = load_config(PAPER / "temperature.yaml"), load_config(PAPER / "temperature.yaml", ["models=laptop"])
    assert gpu.experiment_id != laptop.experiment_id and gpu.models is None
    assert laptop.model_dump(mode="json")["models"] == "laptop"
    # A config without a profile keeps its id: `models` is left out of the hash, as the engines decide.
    assert gpu.config_hash == load_config(PAPER / "temperature.yaml", ["models=null"]).config_hash
    one = load_config(PAPER / "temperature.yaml", ["models=served"])
    served.setenv("KEYNES_SERVED_URL", "http://127.0.0.1:10/v1")
    other = load_config(PAPER / "temperature.yaml", ["models=served"])  # read again: the variable changed
    assert one.arms.engines[0].base_url == URL and other.arms.engines[0].base_url == "http://127.0.0.1:10/v1"
    assert one.experiment_id != other.experiment_id


@pytest.mark.parametrize("ref", ["a" * 5000, "~no-such-user-here/p.yaml", "nul\x00.yaml"])
def test_a_profile_name_no_file_system_can_hold_is_refused_as_unknown(ref):
    with pytest.raises(ConfigError, match=r"^models: '.*' is neither a shipped profile \(hosted, laptop, served\) nor a profile file$"):
        load_config(PAPER / "offset.yaml", [f"models={ref}"])


def test_a_profile_file_by_path_with_a_variables_default(tmp_path, monkeypatch):
    monkeypatch.delenv("KEYNES_TEST_MODEL", raising=False)
    profile = tmp_path / "mine.yaml"
    profile.write_text("engines:\n  - {kind: llamacpp, model: '${KEYNES_TEST_MODEL:-smollm2-135m-instruct}'}\nset: [population.size=4]\n")
    cfg = load_config(PAPER / "offset.yaml", [f"models={profile}"])
    assert [leaf(e) for e in engines_of(cfg)] == [leaf(SMOLLM2)] and cfg.population.size == 4 and cfg.models == str(profile)


@pytest.mark.parametrize(("profile", "error"), [
    ("engines: [{kind: llamacpp, n_ctx: -1}]", "engines.0.n_ctx: -1: input should be greater than 0"),
    ("engines: [{kind: llamacpp, n_cxt: 64}]", "engines.0.n_cxt: unknown key (did you mean 'n_ctx'?)"),
    ("engines: [{kind: simulated}]", "engines.0.kind: 'simulated'; a profile's engines are LLM engines (llamacpp, openai, vllm)"),
    ("engines: [{kind: openai, model: m}]", "engines.0.base_url: required"),
    ("engines: []", "engines: expected a list of engine blocks (mappings with `kind:`)"),
    ("engines: [{kind: llamacpp}]\nsize: 3", "size: unknown key (known keys: description, engines, set)"),
    ("engines: [{kind: llamacpp, model: '${KEYNES_TEST_NOT_SET}'}]", "$KEYNES_TEST_NOT_SET is not set (engines.0.model); export KEYNES_TEST_NOT_SET=..."),
    ("engines: [{kind: llamacpp}]\nset: [population.size]", "set: --set 'population.size': expected dotted.key=value"),
])
def test_a_bad_profile_file_is_refused_in_one_line_naming_the_field(tmp_path, monkeypatch, profile, error):
    monkeypatch.delenv("KEYNES_TEST_NOT_SET", raising=False)
    path = tmp_path / "bad.yaml"
    path.write_text(profile + "\n")
    with pytest.raises(ConfigError) as refused:
        load_config(PAPER / "offset.yaml", [f"models={path}"])
    assert str(refused.value) == f"models: {path}: {error}"


def test_an_unknown_profile_and_a_missing_variable_exit_2_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("KEYNES_SERVED_URL", raising=False)
    result, lines = invoke("plan", str(PAPER / "temperature.yaml"), "--models", "laptopp", "--calibrate", "0")
    assert result.exit_code == 2 and lines == ["error: models: 'laptopp' is neither a shipped profile (hosted, laptop, served) nor a profile file"]
    db = tmp_path / "never.duckdb"
    result, lines = invoke("run", str(PAPER / "temperature.yaml"), "--models", "served", "--db", str(db))
    assert result.exit_code == 2 and lines == ["error: models: served: $KEYNES_SERVED_URL is not set (engines.0.base_url); export KEYNES_SERVED_URL=..."]
    assert not db.exists()
