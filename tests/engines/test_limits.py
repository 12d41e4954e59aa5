"""Rate limits of the openai engine: the buckets themselves, Retry-After, and a
requests_per_minute limit held across two Ray actors against the real llama.cpp server."""

from __future__ import annotations

import duckdb
import pytest

from engines.limits import Bucket, Limits
from tests.engines.test_openai import batch, engine_for
from tests.support.fault_proxy import FaultProxy, cycle, first


def test_a_bucket_spreads_requests_evenly():
    bucket = Bucket(per_minute=120)  # 2 a second, a burst of 2
    now = bucket.at
    waits = [bucket.reserve(1, now=now) for _ in range(6)]
    assert waits == pytest.approx([0, 0, 0.5, 1.0, 1.5, 2.0])
    assert bucket.reserve(1, now=now + 4.0) == pytest.approx(0.0)  # refilled meanwhile


def test_tokens_are_reserved_then_settled_by_the_reported_usage():
    limits = Limits(tokens_per_minute=600)  # 10 tokens a second
    assert limits.reserve(10) == 0
    assert limits.reserve(10) == pytest.approx(1.0, abs=0.01)
    limits.settle(-20)  # both used nothing after all: their tokens come back
    assert limits.reserve(10) == pytest.approx(0.0, abs=0.01)
    limits.hold(2.0)  # a server's Retry-After holds everyone back
    assert limits.reserve(0) == pytest.approx(2.0, abs=0.05)


def test_a_bad_limit_is_refused_with_its_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="requests_per_minute"):
        engine_for("http://127.0.0.1:1/v1", requests_per_minute=0)


@pytest.mark.llm
def test_retry_after_is_honoured(llama_server):
    with FaultProxy(llama_server.port, first("retry-after:2")) as proxy:
        engine = engine_for(proxy.base_url, backoff_s=0.01, requests_per_minute=600)
        try:
            out = engine.generate(batch(1))
        finally:
            engine.close()
    assert out.error == [None] and list(out.attempts) == [2]
    limited, retried = proxy.events[0], proxy.events[1]
    assert limited.status == 429 and retried.status == 200
    assert retried.at - limited.at >= 2.0  # not the 10 ms backoff: the server's 2 s


@pytest.mark.llm
def test_requests_per_minute_holds_across_two_actors(llama_server, tmp_path, prefect_api, local_ray):
    from flows.experiment import experiment

    # One request every 3 s from both actors together: slower than the server answers even on
    # a busy machine, so the limit, not the server, sets the pace.
    rpm, n = 20, 8
    with FaultProxy(llama_server.port, cycle("pass")) as proxy:
        config = {
            "name": "rate-limited", "seed": 3,
            "population": {"spec": "education.yaml", "size": n},
            "game": {"rounds": 1},
            "arms": {"engines": [{"kind": "openai", "base_url": proxy.base_url, "model": "gemma-3-270m",
                                  "concurrency": 4, "requests_per_minute": rpm}], "prompts": ["basic"]},
            "workers": {"actors": 2, "shard_size": 4},
            "report": {"enabled": False},
        }
        db = tmp_path / "limited.duckdb"
        summary = experiment(config, db=str(db))
        times = sorted(e.at for e in proxy.events if e.path.endswith("completions"))
    assert summary.rows_written == n and len(times) == n
    with duckdb.connect(str(db), read_only=True) as con:
        workers = con.execute("select count(distinct worker), sum(limit_wait_s) from shards").fetchall()[0]
        valid = con.execute("select count(*) filter (valid) from guesses").fetchall()[0][0]
    assert workers[0] == 2 and valid == n  # both actors played, every answer is a number
    assert workers[1] > 0  # the wait is recorded with the shards
    # In any stretch of requests, no more went than the burst (1) plus the rate times its length;
    # unlimited, the two actors send all 8 in about the time the server needs (a few seconds).
    rate, burst = rpm / 60, max(1.0, rpm / 60)
    for i in range(n):
        for j in range(i + 1, n):
            assert j - i + 1 <= burst + rate * (times[j] - times[i]) + 1, (i, j, times)  # + 1: timer jitter
    # The whole run: at least n − burst − 1 intervals (the same one request of jitter as above: a
    # loaded machine once sent the first permitted request 1.7 s late, 19.3 s for 8 requests).
    # Unlimited, it would take a few seconds.
    assert times[-1] - times[0] >= (n - burst - 1) / rate, times
