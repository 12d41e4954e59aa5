"""The openai engine against a real OpenAI-compatible server (llama-cpp-python's, on 127.0.0.1)."""

from __future__ import annotations

import re
import socket
import threading
import time

import duckdb
import httpx
import numpy as np
import pytest

from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec
from prompts.answers import number_regex
from tests.engines.conftest import LlamaServer
from tests.support.waiting import free_port

pytestmark = pytest.mark.llm

PROMPT = (
    "You are playing a number-guessing game with 30 players. Each player names an integer between 0 and 100. "
    "The player whose number is closest to 2/3 of the average of all numbers named wins.\n\n"
    "Answer with a single number.\nMy number is:"
)
INTEGER = Constraint(0, 100, True)


def engine_for(base_url: str, **settings):
    return build_engine(parse_spec({"kind": "openai", "base_url": base_url, "model": "gemma-3-270m", **settings}))


def batch(n: int, constraint: Constraint | None = INTEGER, prompt: str = PROMPT, max_tokens: int = 8) -> RequestBatch:
    ids = np.arange(n, dtype=np.int64)
    return RequestBatch(ids, [prompt] * n, ids * 7919 + 1, Sampling(0.9, max_tokens), constraint)


def test_constrained_answers_tokens_and_seeds(llama_server):
    engine = engine_for(llama_server.base_url, concurrency=4)
    try:
        # The server's first evaluation of a prompt (cold cache) can differ from later ones in
        # the last bits of its logits: compare two calls made once the prompt is cached.
        engine.generate(batch(6))
        out = engine.generate(batch(6))
        again = engine.generate(batch(6))
    finally:
        engine.close()
    assert all(re.fullmatch(number_regex(0, 100), t) for t in out.text), out.text
    assert out.error == [None] * 6 and (out.attempts == 1).all()
    assert (out.prompt_tokens > 40).all() and (out.completion_tokens >= 1).all() and (out.latency_s > 0).all()
    assert again.text == out.text  # the seed travels with each request


def test_real_number_answers_use_the_grammar(llama_server):
    engine = engine_for(llama_server.base_url)
    try:
        out = engine.generate(batch(4, Constraint(0, 1, False), PROMPT.replace("an integer between 0 and 100", "a number between 0 and 1")))
    finally:
        engine.close()
    assert all(re.fullmatch(number_regex(0, 1, False), t) for t in out.text), out.text


def test_free_text_is_returned_as_is(llama_server):
    engine = engine_for(llama_server.base_url)
    try:
        out = engine.generate(batch(2, None, PROMPT.replace("My number is:", "Reasoning: Let's think step by step. First,"), 32))
    finally:
        engine.close()
    assert all(t.strip() for t in out.text) and out.error == [None, None]
    assert (out.completion_tokens <= 32).all()


def test_answers_are_validated_when_the_server_is_not_told_the_constraint(llama_server):
    # Without constraint fields the base model writes what it likes: every answer is
    # checked, resampled with fresh seeds, and stored with an error when still invalid.
    engine = engine_for(llama_server.base_url, constraint_fields=[], resamples=1)
    try:
        out = engine.generate(batch(6, max_tokens=6))
    finally:
        engine.close()
    pattern = re.compile(number_regex(0, 100))
    for text, error, attempts in zip(out.text, out.error, out.attempts):
        if pattern.fullmatch(text):
            assert error is None and attempts in (1, 2)
        else:
            assert attempts == 2 and "is not a number in [0, 100] after 2 sample(s)" in error
    assert any(e is not None for e in out.error), out.text  # 6 free-form answers from a base model


def test_a_client_error_is_not_retried(llama_server):
    engine = engine_for(llama_server.base_url.replace("/v1", "/v9"), backoff_s=0.01)
    try:
        out = engine.generate(batch(2))
    finally:
        engine.close()
    assert list(out.attempts) == [1, 1] and all(e.startswith("HTTP 404") for e in out.error)


def test_the_error_is_stored_when_the_retry_budget_is_spent():
    engine = engine_for(f"http://127.0.0.1:{free_port()}/v1", max_attempts=3, backoff_s=0.01)
    try:
        out = engine.generate(batch(3))
    finally:
        engine.close()
    assert list(out.attempts) == [3, 3, 3] and out.text == ["", "", ""]
    assert all(e.startswith("gave up after 3 attempts: ConnectError") for e in out.error), out.error


def test_a_server_moves_off_a_taken_port_and_restarts_on_its_own(gguf, tmp_path):
    # A port found free is not reserved: another process may bind it first. The first start
    # moves to a fresh port; a restart keeps the port clients hold, waiting until it is free.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", free_port()))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = LlamaServer(gguf, taken, tmp_path / "moved")
        try:
            server.start()
            assert server.port != taken and server.lost_binds == 1
            moved = server.port
            server.kill()
            blocker = socket.socket()
            blocker.bind(("127.0.0.1", moved))
            blocker.listen()
            threading.Timer(2.0, blocker.close).start()  # held for 2 s after the crash
            server.start()
            assert server.port == moved and server.lost_binds == 1  # waited instead of losing the bind
            assert httpx.get(f"{server.base_url}/models", timeout=10).status_code == 200
        finally:
            server.stop()


def test_requests_wait_for_a_server_that_is_starting(gguf, tmp_path):
    server = LlamaServer(gguf, free_port(), tmp_path / "late")
    engine = engine_for(server.base_url, backoff_s=0.5, max_backoff_s=4, max_attempts=30)
    # The engine holds the address already: the server must come up on that port.
    starter = threading.Timer(1.0, server.start, kwargs={"keep_port": True})
    starter.start()
    try:
        out = engine.generate(batch(4))
    finally:
        starter.join()
        engine.close()
        server.stop()
    assert out.error == [None] * 4 and all(re.fullmatch(number_regex(0, 100), t) for t in out.text)
    assert (out.attempts > 1).all()


def test_a_round_survives_the_server_being_killed_and_restarted(gguf, tmp_path, prefect_api, local_ray):
    from flows.experiment import experiment

    n = 24
    server = LlamaServer(gguf, free_port(), tmp_path / "server")
    server.start()
    port = server.port
    config = {
        "name": "openai-outage", "seed": 11,
        "population": {"spec": "education.yaml", "size": n},
        "game": {"rounds": 1},
        "arms": {"engines": [{"kind": "openai", "base_url": server.base_url, "model": "gemma-3-270m",
                              "concurrency": 3, "backoff_s": 0.5, "max_backoff_s": 4, "max_attempts": 40}],
                 "prompts": ["basic"]},
        "workers": {"actors": 2, "shard_size": 4},
        "report": {"enabled": False},
    }
    outage: dict[str, int] = {}

    def kill_and_restart() -> None:
        deadline = time.monotonic() + 600
        while server.completions_served() < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()  # SIGKILL mid-round: in-flight requests die with their connections
        outage["served_before_kill"] = server.completions_served()
        time.sleep(2)
        server.start()  # same port (waiting for it to be free); clients keep retrying while it loads
        outage["restarted"] = server.port

    killer = threading.Thread(target=kill_and_restart, daemon=True)
    killer.start()
    db = tmp_path / "outage.duckdb"
    try:
        summary = experiment(config, db=str(db))
    finally:
        killer.join(timeout=600)
        server.stop()
    assert 5 <= outage["served_before_kill"] < n  # the outage really happened mid-round
    assert outage["restarted"] == port  # back at the address the clients hold
    assert server.starts == 2 and server.completions_served(2) >= n - outage["served_before_kill"]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("select count(*), count(distinct agent_id), count(*) filter (valid), max(attempts), "
                           "count(*) filter (error is not null) from guesses").fetchall()
        guesses = [r[0] for r in con.execute("select guess from guesses").fetchall()]
    assert summary.rows_written == n
    assert rows[0][:3] == (n, n, n) and rows[0][4] == 0  # none lost, none duplicated, all valid
    assert rows[0][3] > 1  # some requests were retried through the outage
    assert all(0 <= g <= 100 and g == round(g) for g in guesses)


def test_a_server_that_ignores_n_is_answered_per_agent_with_a_warning(llama_server, caplog):
    """llama-cpp-python's server drops ``n`` (one choice a request): the agents left without a
    choice are answered one request each, the setting named once in a warning, and so is every
    later batch of the engine."""
    engine = engine_for(llama_server.base_url, completions_per_request=4)
    try:
        with caplog.at_level("WARNING", logger="keynes.engines.openai"):
            out = engine.generate(batch(4))
            first_requests = engine.requests
            engine.generate(batch(3))
    finally:
        engine.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "keynes.engines.openai"]
    assert len(warnings) == 1 and warnings[0].startswith(f"completions_per_request: the server at {llama_server.base_url} answered 1 choice(s) for n=4")
    assert out.error == [None] * 4 and all(re.fullmatch(number_regex(0, 100), t) for t in out.text), out.text
    assert first_requests == 4 and engine.requests == 7 and engine.per_request == 1
