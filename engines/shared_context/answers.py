"""A constrained batch answered from exact distributions: one per distinct prompt, one seeded draw per agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from engines.shared_context.board import Board, Claims
from engines.shared_context.chain import Chain
from engines.shared_context.walk import Distribution

if TYPE_CHECKING:
    from engines import CompletionBatch, RequestBatch

# --------------------------------------------------------------------------- a batch
def context_hash(prompt: str, chain: Chain, low: float, high: float, integer: bool, max_tokens: int) -> str:
    """A short stable key of one group: the prompt and everything its distribution depends on."""
    import hashlib

    blob = "\x1f".join([prompt, repr(chain), f"{low:g}", f"{high:g}", str(integer), str(max_tokens)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prompt_groups(prompts: Sequence[str]) -> tuple[list[str], list[np.ndarray]]:
    """A batch's distinct prompts, sorted, and the rows that hold each (in batch order)."""
    import polars as pl

    frame = pl.DataFrame({"prompt": pl.Series(list(prompts), dtype=pl.String)}).with_row_index("row")
    groups = frame.group_by("prompt").agg("row").sort("prompt")
    return groups["prompt"].to_list(), [np.asarray(rows, np.int64) for rows in groups["row"].to_list()]


#: ``compute(prompts, claims) -> [(distribution, prompt tokens), the exception that prevented it,
#: or None]``: an engine's distributions of a batch's prompts; with ``claims`` (a pool's board,
#: else None), None for a prompt another engine claimed.
Compute = Callable[[list[str], "Claims | None"], list["tuple[Distribution, int] | Exception | None"]]


class SharedContextAnswers:
    """Answers a constrained batch from exact distributions: one per distinct prompt.

    Agents are grouped by prompt (the batch shares sampling and constraint); each group's
    distribution is computed once (and kept, ``cache_size`` of them, for later shards: it
    is a function of the prompt alone) and every agent draws its answer with its own seed.
    With a ``board`` (``engines.shared_context.board``: the engine is one of a pool's), each distribution is
    computed by one engine of the pool: this one claims prompts as it goes and reads the rest.
    """

    def __init__(self, cache_size: int = 4096):
        self.cache_size = cache_size
        self._cache: dict[str, tuple[Distribution, int]] = {}
        self.board: Board | None = None
        self.owner = 0  # this engine's rank in its pool
        self.start = 0.0  # where in a batch's sorted prompts it begins claiming (rank / pool size)
        self.computed = 0  # distributions this engine computed (not read from its cache or its pool)

    def share(self, board: Board, owner: int, peers: int) -> None:
        """Share distributions with a pool of ``peers`` engines through ``board``; this is ``owner``."""
        self.board, self.owner, self.start = board, owner, owner / max(peers, 1)

    def _keep(self, key: str, found: tuple[Distribution, int]) -> None:
        if len(self._cache) >= self.cache_size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = found

    def complete(self, batch: "RequestBatch", chain: Chain, compute: Compute) -> "CompletionBatch":
        import time

        import polars as pl

        from engines import CompletionBatch

        c = batch.constraint
        assert c is not None, "shared answers need a constraint"
        max_tokens = batch.sampling.max_tokens
        n = len(batch)
        prompts, members = prompt_groups(batch.prompt)
        keys = [context_hash(p, chain, c.low, c.high, c.integer, max_tokens) for p in prompts]
        todo = [i for i, k in enumerate(keys) if k not in self._cache]
        start = time.perf_counter()
        failed: dict[str, str] = {}
        asked = [prompts[i] for i in todo]
        claims = Claims(self.board, self.owner, [keys[i] for i in todo], self.start) if self.board is not None and todo else None
        results = compute(asked, claims) if todo else []
        if claims is not None:  # the prompts other engines of the pool claimed, as they publish them
            theirs = claims.others()
            results = [theirs.get(j, result) if result is None else result for j, result in enumerate(results)]
            # A claim not published in time (its engine died): computed here.
            missing = [j for j, result in enumerate(results) if result is None]
            for j, result in zip(missing, compute([asked[j] for j in missing], None) if missing else []):
                results[j] = result
            here = claims.mine | set(missing)
        else:
            here = set(range(len(todo)))
        self.computed += sum(isinstance(results[j], tuple) for j in here)
        for i, result in zip(todo, results):
            if isinstance(result, Exception):
                failed[keys[i]] = f"{type(result).__name__}: {result}".splitlines()[0][:500]
            elif result is not None:
                self._keep(keys[i], result)
        seconds = time.perf_counter() - start
        text = np.empty(n, object)
        prompt_tokens = np.zeros(n, np.int64)
        completion_tokens = np.zeros(n, np.int64)
        context = np.empty(n, object)
        seeds = np.asarray(batch.seed)
        error: list[str | None] = [None] * n
        rows_out = []
        for key, rows in zip(keys, members):
            if key in failed:
                text[rows] = ""
                for r in rows.tolist():
                    error[r] = failed[key]
                continue
            dist, tokens = self._cache[key]
            leaf = dist.draw(seeds[rows])
            text[rows] = np.asarray(dist.leaf_text, object)[leaf]
            completion_tokens[rows] = dist.leaf_tokens[leaf]
            prompt_tokens[rows] = tokens
            context[rows] = key
            rows_out.append(dist.frame(key, len(rows)))
        distributions = pl.concat(rows_out) if rows_out else None
        return CompletionBatch(
            text=text.tolist(),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            # The batch's compute time, shared equally: the latencies of a shard sum to its time.
            latency_s=np.full(n, seconds / max(n, 1)),
            attempts=np.ones(n, np.int64),
            error=error,
            shared_prompt=np.ones(n, bool),
            context=context.tolist(),
            distributions=distributions,
        )
