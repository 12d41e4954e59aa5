"""What a token costs on llama.cpp, by the shape of the decode that evaluates it (Gemma 3 270M).

The shared-context path's later rounds are at the prompt-trie limit: it evaluates each distinct
prompt's tokens past the prefix it shares, plus one token per answer-tree node, within ~1.2x of
the least that could be evaluated (benchmark (e) of benchmarks/shared_context.py). What is left
is the cost of a token, and this benchmark measures it for every decode shape those paths could
use, one thread as one actor has: a real round-5 prompt of the paper's five-round game
(experiments/paper/five_rounds.yaml) evaluated

- in one KV stream, in blocks of 16 (the exact paths' block), 32, 64 and 128 tokens a decode;
- in K streams at once, a 16-token block of each per decode (prompts batched together);
- as answer-tree nodes: K rows a decode, each in a stream that holds the prompt, computing the
  answer tokens' logits only (engines/llamacpp/head.py), as the shared path's steps do (K = 2).

Each figure is the best of ``--repeat`` runs (the machine is shared: the best is the closest to
what the decode itself costs).

    uv run --extra llamacpp python benchmarks/decode_shapes.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

from core.game import GameRule  # noqa: E402
from populations.sampler import sample  # noqa: E402
from populations.spec import load_spec  # noqa: E402
from prompts.context import agent_variables, round_variables  # noqa: E402
from prompts.render import render  # noqa: E402

BLOCKS = (16, 32, 64, 128)
STREAMS = (2, 4, 8)
NODES = (1, 2, 4, 8, 16)
#: Four earlier rounds as agents of the five-round game see them in round 5, and one agent's guesses.
HISTORY = [{"round": 1, "mean": 41.37, "winning_guess": 27.58}, {"round": 2, "mean": 30.12, "winning_guess": 20.08},
           {"round": 3, "mean": 22.64, "winning_guess": 15.09}, {"round": 4, "mean": 17.9, "winning_guess": 11.93}]
OWN_GUESSES = [45, 33, 25, 18]


def round_five_prompt() -> str:
    """A round-5 prompt of the five-round game: the rules, four rounds told with the agent's own
    guesses, its persona, the cue (prompts/basic.j2, as ``keynes run`` renders it)."""
    rule = GameRule(rounds=5)
    personas = sample(load_spec("education.yaml"), 1000, seed=1)
    agents = agent_variables(personas.head(1)).with_columns(own_guesses=pl.lit(OWN_GUESSES, dtype=pl.List(pl.Int64)))
    return render("basic.j2", round_variables(rule, personas, 5, HISTORY), agents)[0]


def best(fn: Callable[[], int], repeat: int) -> float:
    """The fewest seconds per unit of ``repeat`` runs of ``fn`` (which returns its units)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        units = fn()
        times.append((time.perf_counter() - start) / units)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each shape; the best is printed")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (an actor has 1)")
    parser.add_argument("--blocks", default=",".join(map(str, BLOCKS)), help="prompt tokens a decode, one stream")
    parser.add_argument("--streams", default=",".join(map(str, STREAMS)), help="streams a decode, 16 tokens each")
    parser.add_argument("--nodes", default=",".join(map(str, NODES)), help="answer-tree nodes a decode")
    args = parser.parse_args()
    blocks, streams, nodes = ([int(x) for x in a.split(",") if x] for a in (args.blocks, args.streams, args.nodes))

    import llama_cpp
    from llama_cpp import Llama

    from engines.llamacpp.batch import Sequences
    from engines.llamacpp.internals import quiet
    from engines.llamacpp.shared_context import output_head, prompt_tokens
    from engines.models import gguf_path

    with quiet():
        llm = Llama(model_path=str(gguf_path("gemma-3-270m")), n_ctx=2048, n_threads=args.threads,
                    n_threads_batch=args.threads, seed=0, verbose=False)
    tokens = prompt_tokens(llm, round_five_prompt())
    n = len(tokens)
    slots = max([*streams, *nodes, 1])
    rows = max([*blocks, *(16 * k for k in streams), 16])
    seq = Sequences(llm, slots, 2048, args.threads, flash_attention=False, head=output_head(llm), rows=rows)
    seq._evaluate(tokens[:16])  # checks the answer tokens' head once, as an engine does
    memory = seq._memory

    def clear() -> None:
        for s in range(slots + 1):
            llama_cpp.llama_memory_seq_rm(memory, s, 0, -1)
        seq._held, seq._held_logits = [], None

    def prompt(block: int, count: int) -> int:
        """The prompt in ``count`` streams, a ``block`` of each a decode, logits of the last row."""
        clear()
        for start in range(0, n, block):
            part = list(zip(range(start, min(n, start + block)), tokens[start:start + block]))
            batch = [(t, q, s) for s in range(count) for q, t in part]
            seq._decode(batch, logits=[False] * (len(batch) - 1) + [True])
        return n * count

    def steps(k: int, count: int = 8) -> int:
        """``count`` decodes of ``k`` answer-tree nodes, each in a stream holding the prompt."""
        for _ in range(count):
            seq._decode([(tokens[1 + s], n, s) for s in range(k)], logits=[True] * k)
            for s in range(k):
                llama_cpp.llama_memory_seq_rm(memory, s, n, -1)
        return count * k

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; Gemma 3 270M, {args.threads} thread(s), "
          f"a round-5 prompt of {n} tokens; the best of {args.repeat} runs")
    found: list[tuple[float, str]] = []
    for block in blocks:
        ms = best(lambda: prompt(block, 1), args.repeat) * 1000
        found.append((ms, f"1 stream, blocks of {block}"))
        print(f"  prompt, 1 stream, blocks of {block:>3}:           {ms:6.2f} ms/token")
    for k in streams:
        ms = best(lambda: prompt(16, k), args.repeat) * 1000
        found.append((ms, f"{k} streams x 16"))
        print(f"  prompt, {k:>2} streams x 16 tokens a decode: {ms:6.2f} ms/token")
    clear()
    seq._evaluate(tokens)
    for s in range(slots):
        seq.take(s)  # the prompt's KV in every stream (copied at the next decode)
    steps(1, 1)
    node_ms: list[tuple[float, int]] = []
    for k in nodes:
        ms = best(lambda: steps(k), args.repeat) * 1000
        node_ms.append((ms, k))
        print(f"  answer-tree nodes, {k:>2} a decode:          {ms * k:6.1f} ms a decode, {ms:6.2f} ms/node")
    seq.close()
    line = "fewest"
    if found:
        ms, shape = min(found)
        line += f" ms per prompt token: {ms:.2f} ({shape})"
    if node_ms:
        ms, k = min(node_ms)
        line += f"{';' if found else ''} per answer-tree node: {ms:.2f} ({k} a decode)"
    print(line)


if __name__ == "__main__":
    main()
