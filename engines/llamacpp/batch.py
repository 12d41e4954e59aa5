"""Free text (chain-of-thought reasoning) for many agents at once on llama.cpp.

One step of a small model on CPU reads every weight to produce one token: decoding one
sequence at a time leaves the cores waiting on memory. Here ``slots`` sequences decode
together, one token each per step, in their own KV streams of one llama.cpp context
(``kv_unified`` off), and a finished sequence's slot takes the next agent at once.

Each agent samples with ``create_completion``'s own sampler chain (``Llama._init_sampler``:
repeat penalty, top-k, top-p, min-p, temperature, then a draw seeded with the agent's seed),
stops where it does (an end-of-generation token, a stop sequence, ``max_tokens``) and counts
tokens as it does. Its text depends on its prompt, its seed and the number of slots only,
never on the other agents of the batch: a prompt is evaluated alone, in blocks at fixed
positions (as in ``engines.llamacpp.shared_context``), into a source stream whose KV is copied
bit for bit to the agent's slot (llama.cpp makes the copy at the next decode, so the
source changes only after a step), and every step decodes exactly ``slots`` rows (idle slots
decode a placeholder; logits are computed only for the rows that draw a token), so each step
runs the same kernels whoever shares it. Agents with the
same prompt share its evaluation; sorted prompts reuse their common prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from engines import Completion, CompletionBatch, Constraint, Sampling
from engines.llamacpp.blocks import BLOCK, common_prefix, prompt_blocks, resume_point
from engines.llamacpp.head import HeadRow, HiddenStates, OutputHead
from engines.llamacpp.internals import (
    close_context,
    completion_sampler,
    context_handle,
    context_memory,
    error_text,
    new_context,
    sampler_handle,
    too_long,
    vocab,
)
from engines.shared_context import AnswerTree, Chain, Distribution, Node, Walker, context_hash

#: Slots of the default engine. A step decodes one token for every slot, busy or not, so a shard
#: of fewer agents than slots pays for the idle ones: 8 suits shards of ~10 agents and more; large
#: shards gain with more (``LlamaCppSpec.sequences``; benchmarks/decode_shapes.py measures what a
#: token costs by the shape of its decode).
SLOTS = 8


@dataclass
class Then:
    """What follows each agent's free text in its own slot: the answer, drawn with the agent's
    seed from the exact distribution of its answer prompt (``engines.shared_context.Walker``).

    ``prompt(index, text)``: the agent's answer prompt (its prompt, free text and cue) as
    text and tokens. The slot keeps the KV of the prompt and the free text, so only the
    tokens after their common prefix are decoded, then the tree's nodes, one per step.
    """

    prompt: Callable[[int, str], tuple[str, list[int]]]
    tree: AnswerTree
    chain: Chain
    constraint: Constraint


@dataclass
class _Agent:
    index: int
    prompt: list[int]
    seed: int
    max_tokens: int
    sampler: Any = None
    tokens: list[int] = field(default_factory=list)  # generated
    kv: list[int] = field(default_factory=list)  # what the slot's KV holds, from position 0
    feed: list[int] = field(default_factory=list)  # to decode before the next logits
    start: float = 0.0
    # the answer phase
    text: str = ""
    answer: list[int] = field(default_factory=list)
    walker: Walker | None = None
    asks: list[Node] = field(default_factory=list)
    computed: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Outcome:
    """Free text per agent and, with ``Then``, its answer (shared-path columns included)."""

    free: list[Completion]
    answers: CompletionBatch | None = None


class Sequences:
    """A llama.cpp context of ``slots`` decoding streams plus one source stream, on a loaded
    ``llama_cpp.Llama``'s weights (the model is shared, not loaded again).

    With ``head`` (``engines.llamacpp.head``), a decode stops at the last hidden state and a row
    gives the logits of the tokens asked only (``row[tokens]``), checked once against the full
    logits at the first prompt (the full logits from then on if they differ).

    ``rows``: the most rows one decode may hold (default: a prompt block, or a step of every
    stream); larger for callers that decode several streams' blocks at once (benchmarks)."""

    def __init__(self, llm: Any, slots: int = SLOTS, n_ctx: int = 2048, threads: int = 1, flash_attention: bool = True,
                 head: OutputHead | None = None, rows: int | None = None):
        import llama_cpp

        self.llm, self.slots, self.n_ctx = llm, slots, n_ctx
        self.source = slots  # the stream prompts are evaluated in
        # The model's own context settings (SWA cache, KV types, RoPE…), with flash attention:
        # a step of 32 streams costs 16 % less with it here (265 ms against 316 ms). Without it
        # (``flash_attention=False``: the model's own setting), a step of 1–3 rows decodes each
        # row bit for bit as the model's own context decodes it alone (engines.llamacpp.shared_context).
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        if flash_attention:
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.n_ctx = n_ctx * (slots + 1)
        rows = max(BLOCK, slots + 1, rows or 0)  # a prompt block, or a step (llama.cpp sizes outputs by streams)
        params.n_batch = params.n_ubatch = params.n_outputs_max = rows
        params.n_seq_max = slots + 1
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads
        self._hidden = HiddenStates(head) if head is not None else None
        if self._hidden is not None:
            self._hidden.params(params)
        self._outputs: list[HeadRow] = []  # the last decode's rows (with ``head``)
        self._output_of: dict[int, int] = {}  # a batch index's output row
        self.ctx = new_context(llm, params)
        self._handle, self._memory = context_handle(self.ctx), context_memory(self.ctx)
        self.n_vocab = llm.n_vocab()
        self._batch = llama_cpp.llama_batch_init(rows, 0, 1)
        self._cells = np.zeros(self.n_vocab, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        self._held: list[int] = []  # the source stream's tokens
        self._held_logits: np.ndarray | None = None
        self.decoded = 0  # rows decoded so far (prompt blocks and steps)

    def generate(self, prompts: Sequence[list[int]], seeds: Sequence[int], sampling: Sampling, stop: Sequence[str],
                 then: Then | None = None) -> Outcome:
        """Free text per prompt (token lists, BOS included), in the order given; with ``then``,
        each agent's answer right after its text, in the same slot."""
        import llama_cpp

        run = _Run(self, prompts, seeds, sampling, stop, then)
        llama_cpp.llama_memory_clear(self._memory, True)
        self._held, self._held_logits = [], None
        while run.queue or any(run.live):
            run.admit()
            if not run.queue and not any(run.live):
                break
            # Every agent admitted may have ended at its first token (max_tokens 1, an end of
            # generation) while the next waits for the source stream: a step of idle slots then
            # makes the pending copies, and the next admit goes on.
            run.step()
        return Outcome(run.free, None if then is None else self._answers(run.answers, run.contexts, run.dists))  # type: ignore[arg-type]

    @staticmethod
    def _answers(rows: list[Completion | None], contexts: list[str | None], dists: list[Distribution | None]) -> CompletionBatch:
        """The answers as the shared path returns them: one group (context) per agent."""
        import polars as pl

        batch = CompletionBatch.from_rows(rows)  # type: ignore[arg-type]
        frames = [d.frame(c, 1) for c, d in zip(contexts, dists) if d is not None]
        batch.shared_prompt = np.array([d is not None for d in dists], bool)
        batch.context = [c if d is not None else None for c, d in zip(contexts, dists)]
        batch.distributions = pl.concat(frames) if frames else None
        return batch

    def _evaluate(self, prompt: list[int]) -> np.ndarray:
        """The next-token logits after ``prompt``, its KV left in the source stream."""
        import llama_cpp

        if prompt == self._held and self._held_logits is not None:
            return self._held_logits
        keep = resume_point(self._held, prompt, len(prompt))
        llama_cpp.llama_memory_seq_rm(self._memory, self.source, keep, -1)
        blocks = list(prompt_blocks(keep, len(prompt)))
        for k, (start, end) in enumerate(blocks):  # logits for the last block's last row only (the KV is the same)
            self._decode([(t, q, self.source) for q, t in zip(range(start, end), prompt[start:end])],
                         logits=[k == len(blocks) - 1 and q == end - 1 for q in range(start, end)])
        hidden = self._hidden
        if hidden is not None and hidden.trusted is None:  # the first prompt: check the head against the full logits
            full = self._full_row(-1)
            hidden.verify(self._outputs[self._output_of[-1]], full, np.argpartition(full, -32)[-32:])
        self._held, self._held_logits = list(prompt), self._row(-1)
        if not isinstance(self._held_logits, HeadRow):
            self._held_logits = self._held_logits.copy()
        return self._held_logits  # type: ignore[return-value]

    def _decode(self, rows: list[tuple[int, int, int]], logits: list[bool] | None = None) -> None:
        """Decode (token, position, stream) rows; logits for the rows ``logits`` marks (default: the last)."""
        import llama_cpp

        b = self._batch
        b.n_tokens = len(rows)
        for k, (token, p, seq) in enumerate(rows):
            b.token[k], b.pos[k], b.n_seq_id[k] = token, p, 1
            b.logits[k] = logits[k] if logits is not None else k == len(rows) - 1
            b.seq_id[k][0] = seq
        code = llama_cpp.llama_decode(self._handle, b)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
        self.decoded += len(rows)
        if self._hidden is not None:
            self._outputs = self._hidden.take()
            flagged = [k for k in range(len(rows)) if b.logits[k]]
            assert len(flagged) == len(self._outputs), (len(flagged), len(self._outputs))
            self._output_of = {k: n for n, k in enumerate(flagged)}
            self._output_of[-1] = len(flagged) - 1

    def take(self, slot: int) -> None:
        """Give stream ``slot`` the source stream's KV (llama.cpp copies it at the next decode:
        the source must not change before then)."""
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._memory, slot, 0, -1)
        llama_cpp.llama_memory_seq_cp(self._memory, self.source, slot, 0, -1)

    def aim(self, slot: int, kv: list[int], target: list[int]) -> list[int]:
        """Make stream ``slot``, which holds ``kv`` (trimmed in place), hold ``target`` but its
        last token: the tokens still to decode there, one a step."""
        import llama_cpp

        keep = min(common_prefix(kv, target), len(target) - 1)
        if keep < len(kv):
            llama_cpp.llama_memory_seq_rm(self._memory, slot, keep, -1)
            del kv[keep:]
        return target[keep:]

    def _row(self, i: int) -> np.ndarray:
        """Batch row ``i``'s logits (-1: the last row): a view of the full row, or with a trusted
        ``head`` a ``HeadRow`` (index it with the tokens wanted)."""
        if self._hidden is not None and self._hidden.trusted:
            return self._outputs[self._output_of[i]]  # type: ignore[return-value]
        return self._full_row(i)

    def _full_row(self, i: int) -> np.ndarray:
        import llama_cpp

        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._handle, i), shape=(self.n_vocab,))

    def _sample(self, sampler: Any, logits: np.ndarray) -> int:
        """What ``llama_sampler_sample`` does, from a logits row: apply the chain, accept the draw."""
        import ctypes

        import llama_cpp

        cells = self._cells
        cells["logit"] = logits
        cells["p"] = 0.0
        cells["id"] = np.arange(self.n_vocab, dtype=np.int32)  # the chain sorts the cells in place
        arr = llama_cpp.llama_token_data_array(
            data=cells.ctypes.data_as(llama_cpp.llama_token_data_p), size=self.n_vocab, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(sampler_handle(sampler), ctypes.byref(arr))
        token = int(arr.data[arr.selected].id)
        llama_cpp.llama_sampler_accept(sampler_handle(sampler), token)
        return token

    def close(self) -> None:
        import llama_cpp

        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        close_context(self.ctx)


class _Run:
    """The state of one ``Sequences.generate`` call: agents waiting, the agent in each slot,
    and what each agent produced. ``admit`` fills free slots from the queue (each agent's
    prompt evaluated in the source stream and copied to its slot); ``step`` decodes one token
    in every slot and hands each slot's logits to its agent (a draw of its text, or a node of
    its answer tree)."""

    def __init__(self, seq: Sequences, prompts: Sequence[list[int]], seeds: Sequence[int], sampling: Sampling,
                 stop: Sequence[str], then: Then | None):
        import llama_cpp

        self.lib, self.seq, self.sampling, self.then = llama_cpp, seq, sampling, then
        self.mem, self.eog = seq._memory, vocab(seq.llm)
        self.stops = [s.encode("utf-8") for s in stop]
        n = len(prompts)
        self.free: list[Completion | None] = [None] * n
        self.answers: list[Completion | None] = [None] * n
        self.contexts: list[str | None] = [None] * n
        self.dists: list[Distribution | None] = [None] * n
        self.queue: list[_Agent] = []
        for i in sorted(range(n), key=lambda i: prompts[i]):
            room = seq.n_ctx - len(prompts[i])
            if room <= 0:
                self.free[i] = Completion("", error=error_text(too_long(len(prompts[i]), seq.n_ctx)))
                self.answers[i] = Completion("", error=self.free[i].error)
            else:
                self.queue.append(_Agent(i, list(prompts[i]), int(seeds[i]), min(sampling.max_tokens, room)))
        self.queue.reverse()  # pop() takes the smallest prompt first
        self.live: list[_Agent | None] = [None] * seq.slots

    def admit(self) -> None:
        """Give every free slot the next agent: its prompt's KV (from the source stream) and its
        sampler, and its first token drawn."""
        seq = self.seq
        copied = False  # a copy between streams is made at the next decode, not at once
        for slot in range(seq.slots):
            while self.live[slot] is None and self.queue:
                if copied and self.queue[-1].prompt != seq._held:
                    break  # the source stream must stay as it is until the next step
                agent = self.queue.pop()
                copied = True
                agent.start = time.perf_counter()
                logits = seq._evaluate(agent.prompt)
                seq.take(slot)
                agent.kv = list(agent.prompt)
                s = self.sampling
                agent.sampler = completion_sampler(  # create_completion's chain, seeded as it seeds
                    seq.llm, agent.seed, **s.chain(), repeat_penalty=s.repeat_penalty,
                )
                self.live[slot] = agent
                self.sample(slot, agent, logits)

    def step(self) -> None:
        """One decode: every slot one token (an idle slot a placeholder at position 0), then
        each agent that has nothing left to feed reads its logits."""
        seq = self.seq
        rows = []
        for slot in range(seq.slots):
            agent = self.live[slot]
            if agent is None:
                self.lib.llama_memory_seq_rm(self.mem, slot, 0, -1)
                rows.append((0, 0, slot))
            else:
                token = agent.feed.pop(0)
                rows.append((token, len(agent.kv), slot))
                agent.kv.append(token)
        # Logits only where they are read: an idle slot or one still feeding has none (the
        # 262k-wide output layer is most of a row's cost). Every row still runs the body.
        seq._decode(rows, logits=[agent is not None and not agent.feed for agent in self.live])
        for slot in range(seq.slots):
            agent = self.live[slot]
            if agent is not None and not agent.feed:
                self.logits_ready(slot, agent, seq._row(slot))

    def aim(self, slot: int, agent: _Agent, target: list[int]) -> None:
        """Make the slot hold ``target`` but its last token, which the next step decodes."""
        agent.feed = self.seq.aim(slot, agent.kv, target)

    def ask(self, slot: int, agent: _Agent) -> None:
        """Evaluate the walk's next node in this slot, or end the answer."""
        assert agent.walker is not None
        while not agent.asks:
            if agent.computed:
                agent.walker.give(agent.computed)
                agent.computed = {}
            if agent.walker.done:
                dist = agent.walker.distribution()
                leaf = int(dist.draw(np.array([agent.seed]))[0])
                self.answers[agent.index] = Completion(dist.leaf_text[leaf], prompt_tokens=len(agent.answer),
                                                       completion_tokens=int(dist.leaf_tokens[leaf]), latency_s=time.perf_counter() - agent.start)
                self.dists[agent.index] = dist
                self.live[slot] = None
                return
            agent.asks = list(agent.walker.asks)
        self.aim(slot, agent, agent.answer + list(agent.asks[0].path))

    def finish(self, slot: int, text: bytes) -> None:
        """The agent's free text ends: store it, then start its answer (with ``Then``) in the same slot."""
        agent, then, n_ctx = self.live[slot], self.then, self.seq.n_ctx
        assert agent is not None
        now = time.perf_counter()
        self.free[agent.index] = Completion(text.decode("utf-8", errors="ignore"), prompt_tokens=len(agent.prompt),
                                            completion_tokens=len(agent.tokens), latency_s=now - agent.start)
        if then is None:
            self.live[slot] = None
            return
        agent.start, agent.text = now, self.free[agent.index].text  # type: ignore[union-attr]
        prompt, agent.answer = then.prompt(agent.index, agent.text)
        self.contexts[agent.index] = context_hash(prompt, then.chain, then.constraint.low, then.constraint.high, then.constraint.integer,
                                                  then.tree.max_tokens)
        if len(agent.answer) + then.tree.max_tokens >= n_ctx:
            self.answers[agent.index] = Completion("", error=error_text(too_long(len(agent.answer), n_ctx)))
            self.live[slot] = None
            return
        agent.walker = Walker(then.tree, then.chain)
        self.ask(slot, agent)

    def sample(self, slot: int, agent: _Agent, logits: np.ndarray) -> None:
        """The agent in ``slot`` draws its next token: end its text, or decode the token next step."""
        llm = self.seq.llm
        token = self.seq._sample(agent.sampler, logits)
        if self.lib.llama_vocab_is_eog(self.eog, token):
            return self.finish(slot, llm.detokenize(agent.tokens, prev_tokens=agent.prompt))
        agent.tokens.append(token)
        text = llm.detokenize(agent.tokens, prev_tokens=agent.prompt)
        hit = [s for s in self.stops if s in text]
        if hit:
            return self.finish(slot, text[: text.index(hit[0])])
        if len(agent.tokens) >= agent.max_tokens:
            return self.finish(slot, text)
        agent.feed = [token]

    def logits_ready(self, slot: int, agent: _Agent, row: np.ndarray) -> None:
        """A slot's logits: the agent's next draw, or a node of its answer tree."""
        if agent.walker is None:
            return self.sample(slot, agent, row)
        node = agent.asks.pop(0)
        agent.computed[id(node)] = row[[t for t, _ in node.children]].copy()
        self.ask(slot, agent)
