"""Models that cannot be prompted as configured stop ``keynes run`` with one line, exit 2.

An unknown model name, ``prompt_format: chat`` for a GGUF without a chat template, and a
prompt longer than the model's context: each is refused before any agent plays, and no
guess is written. The prompt format each run used is stored with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app

pytestmark = pytest.mark.llm

BASE = {
    "name": "model-checks",
    "population": {"spec": "education.yaml", "size": 4},
    "game": {"rounds": 2},
    "arms": {"engines": [{"kind": "llamacpp"}], "prompts": ["basic"]},
    "workers": {"actors": 1, "shard_size": 4},
    "report": {"enabled": False},
}


def run(tmp_path: Path, engine: dict, prompts: list[str] = ["basic"]) -> tuple[int, list[str], Path]:
    data = {**BASE, "arms": {"engines": [engine], "prompts": prompts, "max_reasoning_tokens": 16}}
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(data))
    db = tmp_path / "w.duckdb"
    result = CliRunner().invoke(app, ["run", str(config), "--db", str(db)])
    return result.exit_code, [line for line in result.stderr.splitlines() if line.strip()], db


def guesses(db: Path) -> int:
    if not db.exists():
        return 0
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("select count(*) from guesses").fetchall()[0][0]


def test_an_unknown_model_name(tmp_path):
    code, lines, db = run(tmp_path, {"kind": "llamacpp", "model": "llama-3-8b"})
    assert code == 2 and len(lines) == 1
    assert lines[0] == (
        "error: arms.engines.0.model: unknown model 'llama-3-8b'; available: gemma-3-270m, "
        "smollm2-135m-instruct, or a path to a .gguf file"
    )
    assert not db.exists()


def test_chat_for_a_gguf_without_a_chat_template(tmp_path):
    code, lines, db = run(tmp_path, {"kind": "llamacpp", "prompt_format": "chat"})
    assert code == 2 and lines == [
        "error: arms.engines.0: prompt_format: chat, but model 'gemma-3-270m' has no chat template "
        "(tokenizer.chat_template); use prompt_format: completion"
    ]
    assert not db.exists()


def test_a_gguf_path_is_read_for_its_template(tmp_path):
    from engines.models import gguf_path

    path = gguf_path("gemma-3-270m")
    code, lines, db = run(tmp_path, {"kind": "llamacpp", "model": str(path), "prompt_format": "chat"})
    assert code == 2 and lines == [
        f"error: arms.engines.0: prompt_format: chat, but model {str(path)!r} has no chat template "
        "(tokenizer.chat_template); use prompt_format: completion"
    ]
    assert not db.exists()


def test_a_prompt_longer_than_the_context(tmp_path, prefect_api, local_ray):
    code, lines, db = run(tmp_path, {"kind": "llamacpp", "model": "smollm2-135m-instruct", "n_ctx": 160}, ["cot"])
    # Found once the personas are sampled, before any agent plays: the run's header, then the error.
    assert code == 2 and lines[0].startswith("model-checks (") and sum(line.startswith("error:") for line in lines) == 1
    match = re.fullmatch(
        r"error: arms\.engines\.0\.n_ctx: 160 tokens cannot hold the longest prompt of mode 'cot' \((\d+) tokens, "
        r"last round\) plus (\d+) for reasoning and answer; raise n_ctx to at least (\d+)",
        lines[-1],
    )
    assert match, lines[-1]
    prompt, reserve, needed = map(int, match.groups())
    assert reserve == 8 + 16 + 16 and needed == prompt + reserve > 160  # answer, reasoning, final cue
    assert guesses(db) == 0


def test_each_run_stores_its_prompt_format_and_template_digest(tmp_path, prefect_api, local_ray):
    from engines.models import MODELS

    mixture = {"kind": "mixture", "components": [
        {"fraction": 0.5, "engine": {"kind": "llamacpp"}},
        {"fraction": 0.5, "engine": {"kind": "llamacpp", "model": "smollm2-135m-instruct"}},
    ]}
    code, lines, db = run(tmp_path, mixture)
    assert code == 0, lines
    with duckdb.connect(str(db), read_only=True) as con:
        (prompting,) = con.execute("select prompting from runs").fetchall()[0]
    import json

    assert json.loads(prompting) == {"components": [
        {"format": "completion", "chat_template_sha256": None},
        {"format": "chat", "chat_template_sha256": MODELS["smollm2-135m-instruct"].chat_template_sha256},
    ]}
    assert guesses(db) == 8
