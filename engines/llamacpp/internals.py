"""Every use of llama-cpp-python's private internals, in one place.

keynes reaches under ``llama_cpp.Llama``'s public API where the exact paths must: the model's
vocabulary handle and special-token flags, the KV cache of the loaded context, a second
context on the same weights (the multi-stream decoder), and ``create_completion``'s own
sampler chain. Each function here names the private member it uses; the low-level C API
(``llama_cpp.llama_decode``…) is public and used where it is needed.
tests/engines/test_llamacpp_internals.py checks each function on the real model, so an
upgrade that changes one of these members fails there, by name, before any answer is wrong.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def quiet() -> Any:
    """A context that silences what llama.cpp's C code prints while a model loads (unless
    ``KEYNES_VERBOSE=1``): ``verbose=False`` still lets lines such as ``llama_kv_cache_iswa:
    using full-size SWA cache`` through, once from every actor. Load errors still raise."""
    from llama_cpp._utils import suppress_stdout_stderr

    return suppress_stdout_stderr(disable=os.environ.get("KEYNES_VERBOSE") == "1")


def silenced() -> Any:
    """A context that always silences llama.cpp's C output (``_utils.suppress_stdout_stderr``)."""
    from llama_cpp._utils import suppress_stdout_stderr

    return suppress_stdout_stderr(disable=False)


# ------------------------------------------------------------------------ the model (Llama._model)
def vocab(llm: Any) -> Any:
    """The model's C vocabulary handle, for ``llama_cpp.llama_token_to_piece`` and friends."""
    return llm._model.vocab


def token_text(llm: Any, token: int) -> str:
    """A token's text as the vocabulary stores it (special tokens as written, e.g. ``<bos>``)."""
    return llm._model.token_get_text(token) if token != -1 else ""


def adds_bos(llm: Any) -> bool:
    """Whether the model's tokenizer adds its BOS token (the GGUF's ``add_bos_token``)."""
    return bool(llm._model.add_bos_token())


def adds_eos(llm: Any) -> bool:
    """Whether the model's tokenizer appends its EOS token."""
    return bool(llm._model.add_eos_token())


# ------------------------------------------------------ the loaded context (Llama._ctx, _input_ids)
def cached_tokens(llm: Any) -> list[int]:
    """The tokens whose KV the loaded context holds, in order."""
    return llm._input_ids[: llm.n_tokens].tolist()


def drop_cache_from(llm: Any, keep: int) -> bool:
    """Remove the loaded context's KV from position ``keep`` on; False if llama.cpp cannot."""
    return bool(llm._ctx.kv_cache_seq_rm(-1, keep, -1))


def eval_without_logits(llm: Any, tokens: list[int]) -> None:
    """``llm.eval(tokens)`` without the logits of the last token (``Llama.eval`` always asks
    llama.cpp for them: one row of the output layer, ~25 ms on Gemma's 262,144-token vocabulary,
    about as long as the rest of a one-token decode). The KV cache llama.cpp writes is the same
    bit for bit: the output rows are chosen after the last layer's keys and values are stored
    (tests/engines/test_llamacpp_internals.py). ``tokens`` must fit one batch (``n_batch``)."""
    if not tokens:
        return
    assert len(tokens) <= llm.n_batch, (len(tokens), llm.n_batch)
    llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
    llm._batch.set_batch(batch=tokens, n_past=llm.n_tokens, logits_all=False)
    llm._batch.batch.logits[len(tokens) - 1] = False  # set_batch always asks for the last row
    llm._ctx.decode(llm._batch)
    llm.input_ids[llm.n_tokens : llm.n_tokens + len(tokens)] = tokens
    llm.n_tokens += len(tokens)


def last_logits(llm: Any, n_vocab: int) -> np.ndarray:
    """The logits row of the loaded context's last evaluated token (a view: copy to keep it)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))


# ------------------------------------------------ a second context on the same weights (_internals)
def new_context(llm: Any, params: Any) -> Any:
    """A new llama.cpp context on ``llm``'s loaded weights (nothing loaded again)."""
    from llama_cpp import _internals

    with quiet():
        return _internals.LlamaContext(model=llm._model, params=params, verbose=False)


def context_handle(context: Any) -> Any:
    """The C ``llama_context`` of a context ``new_context`` made, for ``llama_cpp.llama_decode``."""
    return context.ctx


def close_context(context: Any) -> None:
    """Free a context ``new_context`` made (the weights stay loaded)."""
    context.close()


def context_memory(context: Any) -> Any:
    """The C memory (KV cache) handle of a context ``new_context`` made, for ``llama_memory_seq_*``."""
    return context.memory


# -------------------------------------------------- create_completion's sampler (Llama._init_sampler)
#: llama.cpp reads this seed as "pick one at random": never pass it.
RANDOM_SEED = 0xFFFFFFFF


def fixed_seed(seed: int) -> int:
    """``seed`` as llama.cpp will use it: ``RANDOM_SEED`` is drawn as the seed below it."""
    return seed if seed != RANDOM_SEED else RANDOM_SEED - 1


def completion_sampler(llm: Any, seed: int, top_k: int, top_p: float, min_p: float, temperature: float, repeat_penalty: float) -> Any:
    """The sampler chain ``create_completion`` builds for these settings, seeded as it seeds
    (``Llama.set_seed``, through ``fixed_seed``)."""
    llm.set_seed(fixed_seed(seed))
    return llm._init_sampler(top_k=top_k, top_p=top_p, min_p=min_p, temp=temperature, repeat_penalty=repeat_penalty)


def sampler_handle(sampler: Any) -> Any:
    """The C ``llama_sampler`` of a chain ``completion_sampler`` made, for ``llama_sampler_apply``."""
    return sampler.sampler


# -------------------------------------------------- errors as llama-cpp-python words them
def too_long(tokens: int, n_ctx: int) -> ValueError:
    """The error ``create_completion`` raises for a prompt of ``tokens`` past a context of
    ``n_ctx``: the exact paths give the same one for the same prompt."""
    return ValueError(f"Requested tokens ({tokens}) exceed context window of {n_ctx}")


def error_text(exc: BaseException) -> str:
    """How a completion stores what prevented it: ``llama.cpp: ValueError: …``."""
    return f"llama.cpp: {type(exc).__name__}: {exc}"
