"""The openai engine's exact path against llama.cpp's real ``llama-server``: the same distributions as
the in-process llama.cpp engine, guesses independent of actors and shards through the shipped
experiments/served_llamacpp.yaml, each start-up failure said in one line, and a served model's
identity covering what the server reports (another GGUF behind the same name is refused on a rerun).

The server is the module's one (``server``: ``llama-server`` built by .ci/llama-server and started as
benchmarks/servers.py starts it, the bundled Gemma 3 270M served as ``gemma-3-270m``); the in-process
reference is the llama.cpp engine on the same file.
"""

from __future__ import annotations

import pytest

from benchmarks.servers import LLAMA_SERVER_HOW, LlamaCppServer, llama_server_built
from engines import Constraint, build_engine, parse_spec
from tests.conftest import REPO
from tests.support.exact import BASIC, CHAINS, ONE, TWO, answer_over_http, batch, compare, play_layouts, prompts
from tests.support.requirements import needs
from tests.support.sql import q
from tests.support.waiting import free_port

pytestmark = [pytest.mark.llm, pytest.mark.slow, needs("llama-server", llama_server_built(), LLAMA_SERVER_HOW)]

SERVED = REPO / "experiments" / "served_llamacpp.yaml"
#: Total variation allowed between a prompt's distribution over HTTP and in process. The chain is
#: the same; the logits are not bit for bit: llama-server evaluates a prompt and path whole, in its
#: own batches, the in-process engine in 16-token blocks with the answer tokens' rows alone. Measured
#: 2026-12-08 on a 2-core AMD EPYC, these 20 prompts: at most 0.058 under the default chain and 0.059
#: under top-p 0.9 without repeat penalty (so not the penalty the server applies), 0.0 greedy — the
#: float noise the suite measures for llama.cpp's batching (0.044 between n_batch 512 and 1, measured
#: 2026-12-02). Allowed: 0.1.
MAX_TVD = 0.1
#: Answers from 0 to 10: llama-server gives a node's probabilities over the whole vocabulary (262,144
#: tokens, sorted per request: 0.4–1.5 s a node here), so the 20 prompts × 3 chains walk trees of 11
#: answers (about 3 nodes each) rather than 101 (about 25); the chain and its settling are the same.
SMALL = Constraint(0, 10, True)


def served_spec(base_url: str, **settings) -> dict:
    return {"kind": "openai", "server": "llamacpp", "base_url": base_url, "model": "gemma-3-270m", "api_key_env": None, **settings}


@pytest.fixture(scope="module")
def server(gguf, tmp_path_factory):
    served = LlamaCppServer(gguf, "gemma-3-270m", tmp_path_factory.mktemp("llama-server") / "server.log")
    served.start()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def reference():
    """Each chain's distributions and drawn answers from the in-process llama.cpp engine."""
    engine = build_engine(parse_spec({"kind": "llamacpp", "model": "gemma-3-270m", "n_threads": 2}))
    try:
        texts = prompts()
        return {name: engine.generate(batch(texts, s, constraint=SMALL)) for name, s in CHAINS.items()}
    finally:
        engine.close()


@pytest.fixture(scope="module")
def over_http(server):
    """The same batches through the openai engine's exact path: (completions by chain, requests sent)."""
    return answer_over_http(served_spec(server.base_url, concurrency=4), constraint=SMALL)


def test_exact_over_http_equals_llamacpp_in_process(reference, over_http):
    compare(over_http[0], reference, MAX_TVD, same_guesses=("temperature 0",))


def test_each_node_is_one_request_and_each_prompt_tokenized_once(over_http):
    _, (tokenized, steps, nodes) = over_http
    print(f"\n/tokenize requests {tokenized}, /completion requests {steps} for {nodes} tree nodes")
    assert tokenized == 3 * 20
    assert nodes >= 3 * 20 and nodes <= steps <= 2 * nodes


def test_start_up_failures_each_say_one_line_naming_the_setting(server, gguf, tmp_path):
    from engines.models import gguf_path
    from engines.openai.exact import check_server
    from tests.engines.conftest import served

    def fails(base_url: str = server.base_url, **settings) -> str:
        with pytest.raises(ValueError) as info:
            check_server(parse_spec({**served_spec(base_url), **settings}))
        line = str(info.value)
        assert "\n" not in line
        return line

    down = f"http://127.0.0.1:{free_port()}/v1"
    assert fails(down).startswith(f"base_url: no server answers at {down}")
    assert fails(model="gemma-9") == f"model: the server at {server.base_url} does not serve 'gemma-9'; it serves gemma-3-270m"
    smollm = str(gguf_path("smollm2-135m-instruct"))
    assert fails(tokenizer=smollm).startswith(f"tokenizer: {smollm!r} splits the probe text into")
    assert fails(prompt_format="chat").startswith("prompt_format: chat is not taken by the exact path over llama-server")
    # llama-cpp-python's server (the slow path for probabilities) is not taken for exact answers.
    with served(gguf, tmp_path / "python-server") as python_server:
        line = fails(python_server.base_url, model=str(gguf))
    assert line.startswith("server: llamacpp:") and "llama-server" in line and "shared_context: false" in line


# ------------------------------------------------------------------- the shipped config
#: Two shards of 4 in the two-actor layout: one for each actor.
AGENTS = 6


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory, prefect_api, local_ray):
    """experiments/served_llamacpp.yaml through the real flow against the module's server, in both
    layouts, guesses from 0 to 10 (``SMALL``'s trees)."""
    return play_layouts(SERVED, [f"arms.engines.0.base_url={server.base_url}", f"game.high={SMALL.high}"],
                        tmp_path_factory.mktemp("served"), AGENTS)


def test_the_served_config_gives_identical_guesses_with_1_or_2_actors_and_shards_of_500_or_4(runs):
    one, two = q(runs[ONE], BASIC), q(runs[TWO], BASIC)
    assert len(one) == 2 * AGENTS and one == two
    assert q(runs[TWO], "select count(distinct worker) from shards") == [(2,)]


def test_the_served_config_stores_every_answer_valid_and_shared(runs):
    path = runs[ONE]
    assert q(path, "select distinct engine, model from guesses") == [("openai", "gemma-3-270m")]
    assert q(path, "select count(*), count(*) filter (where valid and error is null) from guesses") == [(4 * AGENTS, 4 * AGENTS)]
    assert q(path, "select count(*) filter (where shared_prompt) from guesses") == [(4 * AGENTS,)]
    assert q(path, "select count(*) from (select context, sum(probability) s from answer_distributions group by all) where abs(s - 1) > 1e-9") == [(0,)]


# ------------------------------------------------------------------- a served model's identity
def test_another_gguf_behind_the_same_name_and_url_is_refused_on_a_rerun(gguf, tmp_path):
    """The served model's identity holds what the server reports of it (``/v1/models``): restarted on
    SmolLM2 under Gemma's name and port, a rerun is refused in one line naming the model, exit 2,
    nothing written; back on Gemma, the recorded inputs are the current ones again."""
    from design.inputs import check_inputs, fingerprint
    from design.loading import load_config
    from engines.models import gguf_path
    from tests.support.cli import invoke
    from warehouse.provenance import record_inputs, recorded_inputs
    from warehouse.store import Warehouse

    served = LlamaCppServer(gguf, "gemma-3-270m", tmp_path / "identity.log")
    served.start()
    try:
        db = tmp_path / "keynes.duckdb"
        overrides = [f"arms.engines.0.base_url={served.base_url}", "population.size=5", "report.enabled=false"]
        cfg = load_config(SERVED, [*overrides, f"db={db}"])
        first = fingerprint(cfg)
        assert first["model gemma-3-270m"].startswith(f"served:{served.base_url} gemma-3-270m server:sha256:")
        warehouse = Warehouse(db)
        warehouse.begin_experiment(cfg.experiment_id, cfg.name, cfg.model_dump(mode="json"), cfg.config_hash, cfg.seed, 5)
        record_inputs(warehouse, cfg.experiment_id, first)
        before = q(db, "select experiment_id, status, inputs from experiments")

        served.restart(gguf_path("smollm2-135m-instruct"))
        result, lines = invoke("run", str(SERVED), "--db", str(db), *[a for o in overrides for a in ("--set", o)])
        assert result.exit_code == 2, result.output
        assert len(lines) == 1 and f"model gemma-3-270m changed since experiment {cfg.experiment_id} was first run" in lines[0], lines
        assert q(db, "select experiment_id, status, inputs from experiments") == before
        assert q(db, "select (select count(*) from runs), (select count(*) from guesses)") == [(0, 0)]

        served.restart(gguf)
        assert check_inputs(cfg.experiment_id, recorded_inputs(Warehouse(db), cfg.experiment_id), fingerprint(cfg)) == first
    finally:
        served.stop()
