"""The vLLM side of shared-context answers: tree-node logits from one ``generate`` per tree level.

Each node asks vLLM for one step with ``logprob_token_ids`` = its allowed children; the engine
runs with ``logprobs_mode="raw_logits"``, so those are the model's raw logits and the same numpy
chain as on llama.cpp (``engines.shared_context.Chain``) turns them into probabilities. All groups'
nodes of a level go in one call; automatic prefix caching evaluates each shared prefix once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engines import CompletionBatch, RequestBatch
from engines.shared_context import AnswerTrees, AnswerVocab, Chain, Distribution, NodeRequest, SharedContextAnswers, assemble, chunks, walk_prompts

#: vLLM's cap on ``logprob_token_ids`` per request (``vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS``).
MAX_IDS = 128

#: What ``vllm.LLM`` needs for this path (raw logits of chosen tokens).
LLM_KWARGS = {"logprobs_mode": "raw_logits", "max_logprobs": MAX_IDS}


def token_texts(tokenizer: Any) -> list[str]:
    """Each token's text as a grammar sees it: SentencePiece ``▁`` is a space, ``<0xNN>`` its byte,
    byte-level BPE symbols their bytes."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    byte_level = any(p and "Ġ" in p for p in pieces[:5000])
    decoder: dict[str, int] = {}
    if byte_level:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        decoder = {c: b for b, c in bytes_to_unicode().items()}
    out: list[str] = []
    for p in pieces:
        if p is None:
            out.append("")
        elif byte_level:
            out.append(bytes(decoder.get(c, 0) for c in p).decode("utf-8", "replace"))
        elif len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            out.append(chr(int(p[3:5], 16)) if int(p[3:5], 16) < 128 else "")
        else:
            out.append(p.replace("▁", " "))
    return out


def eog_ids(tokenizer: Any, model_path: str) -> list[int]:
    """The tokens that end generation: the tokenizer's EOS and the model's generation config's."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    config = Path(model_path) / "generation_config.json"
    if config.exists():
        eos = json.loads(config.read_text()).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids)


class VllmSharedContext:
    """Exact answer distributions on a loaded ``vllm.LLM`` (started with ``LLM_KWARGS``)."""

    def __init__(self, llm: Any, model_path: str):
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.vocab = AnswerVocab.from_pieces(token_texts(self.tokenizer), eog_ids(self.tokenizer, model_path))
        self.answers = SharedContextAnswers()
        self.tree = AnswerTrees(self.vocab)

    def generate(self, batch: RequestBatch, chain: Chain, max_model_len: int, add_special_tokens: bool = True) -> CompletionBatch:
        """The batch's answers from the exact distribution of each distinct prompt.

        ``add_special_tokens``: whether the tokenizer adds its BOS, as vLLM does for plain
        text (a chat-rendered prompt writes its own special tokens).
        """
        assert batch.constraint is not None
        tree = self.tree(batch.constraint, batch.sampling.max_tokens)

        def compute(prompts: list[str], claims: object = None) -> list[tuple[Distribution, int] | Exception]:
            # Every prompt, a tree level per generate: no pool board (engines.shared_context.board) is given to vLLM.
            ids = self.tokenizer(prompts, add_special_tokens=add_special_tokens)["input_ids"]
            return walk_prompts(ids, tree, chain, max_model_len, self.evaluate)

        return self.answers.complete(batch, chain, compute)

    def evaluate(self, prompts: list[list[int]], requests: list[NodeRequest]) -> list[np.ndarray]:
        """Raw logits of each request's allowed tokens after its prompt + path, in one ``generate``."""
        from vllm import SamplingParams

        parts = chunks(prompts, requests, MAX_IDS)
        params = [SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(p.tokens), detokenize=False) for p in parts]
        outputs = self.llm.generate([{"prompt_token_ids": list(p.prompt)} for p in parts], params, use_tqdm=False)
        steps = [{t: out.outputs[0].logprobs[0][t].logprob for t in p.tokens} for p, out in zip(parts, outputs)]
        return assemble(requests, parts, steps)
