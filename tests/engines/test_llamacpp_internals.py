"""engines/llamacpp/internals.py on the real Gemma 3 270M: each use of llama-cpp-python's
private members still does what the exact paths rely on. An upgrade that renames or changes one
fails here, by name, before any answer drawn on the shared path could be wrong."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

from engines.llamacpp import internals

pytestmark = pytest.mark.llm

PROMPT = "You are playing a number-guessing game. Answer with a single number.\nMy number is: "


@pytest.fixture(scope="module")
def llm(gguf):
    from llama_cpp import Llama

    with internals.quiet():
        model = Llama(model_path=str(gguf), n_ctx=256, n_threads=1, verbose=False)
    yield model
    model.close()


def tokens(llm) -> list[int]:
    return llm.tokenize(PROMPT.encode(), add_bos=True, special=True)


def test_the_models_vocabulary_and_special_tokens(llm):
    import llama_cpp

    assert internals.token_text(llm, llm.token_bos()) == "<bos>"
    assert internals.token_text(llm, llm.token_eos()) == "<eos>"
    assert internals.token_text(llm, -1) == ""
    assert internals.adds_bos(llm) is True and internals.adds_eos(llm) is False  # Gemma's GGUF header
    handle = internals.vocab(llm)
    assert llama_cpp.llama_vocab_is_eog(handle, llm.token_eos())
    assert not llama_cpp.llama_vocab_is_eog(handle, llm.tokenize(b"7", add_bos=False)[0])
    buf = ctypes.create_string_buffer(16)
    size = llama_cpp.llama_token_to_piece(handle, llm.token_bos(), buf, len(buf), 0, True)
    assert buf.raw[:size] == b"<bos>"


def test_the_kv_cache_is_read_trimmed_and_its_last_logits_reproduce(llm):
    ids = tokens(llm)
    llm.reset()
    llm.eval(ids)
    assert internals.cached_tokens(llm) == ids
    full = internals.last_logits(llm, llm.n_vocab()).copy()
    assert full.shape == (llm.n_vocab(),) and np.isfinite(full).all()
    # Drop the cache after 8 tokens, evaluate the rest again: the same last row.
    assert internals.drop_cache_from(llm, 8)
    llm.n_tokens = 8
    assert internals.cached_tokens(llm) == ids[:8]
    llm.eval(ids[8:])
    assert np.allclose(internals.last_logits(llm, llm.n_vocab()), full, atol=1e-3)


def test_decodes_without_logits_leave_the_same_kv_bit_for_bit(llm):
    """Blocks of the prompt and single tokens evaluated without their logits, then the last block
    with them: the same last logits row as evaluating every step with ``llm.eval``, bit for bit,
    and the context holds the same tokens."""
    ids = tokens(llm)
    steps = [(0, 8), (8, 16), *((p, p + 1) for p in range(16, len(ids) - 3)), (len(ids) - 3, len(ids))]

    def last_row(without_logits: bool) -> np.ndarray:
        llm.reset()
        assert internals.drop_cache_from(llm, 0)
        for start, end in steps[:-1]:
            if without_logits:
                internals.eval_without_logits(llm, ids[start:end])
            else:
                llm.eval(ids[start:end])
        assert llm.n_tokens == steps[-1][0] and internals.cached_tokens(llm) == ids[: steps[-1][0]]
        llm.eval(ids[steps[-1][0]:])
        return internals.last_logits(llm, llm.n_vocab()).copy()

    expected = last_row(False)
    row = last_row(True)
    assert internals.cached_tokens(llm) == ids
    assert np.array_equal(row, expected), float(np.abs(row - expected).max())
    assert not np.array_equal(row, np.zeros_like(row))


def test_a_second_context_on_the_same_weights_decodes_the_same_logits(llm):
    import llama_cpp

    ids = tokens(llm)
    llm.reset()
    llm.eval(ids)
    expected = internals.last_logits(llm, llm.n_vocab()).copy()
    params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 256, 64, 64, 1
    context = internals.new_context(llm, params)
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    try:
        llama_cpp.llama_memory_clear(internals.context_memory(context), True)
        batch.n_tokens = len(ids)
        for k, token in enumerate(ids):
            batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = token, k, 1, k == len(ids) - 1
            batch.seq_id[k][0] = 0
        assert llama_cpp.llama_decode(internals.context_handle(context), batch) == 0
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(internals.context_handle(context), -1), shape=(llm.n_vocab(),))
        assert np.allclose(row, expected, atol=1e-2), float(np.abs(row - expected).max())
    finally:
        llama_cpp.llama_batch_free(batch)
        internals.close_context(context)


@pytest.mark.parametrize("seed", [1, 7, 0xFFFFFFFF])
def test_the_completion_sampler_draws_create_completions_first_token(llm, seed):
    """The chain applied to a logits row (as engines/llamacpp/batch.py applies it) draws the
    token ``create_completion`` draws with the same seed and settings."""
    import llama_cpp

    settings = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 1.5, "repeat_penalty": 1.0}
    # llama.cpp reads the seed 0xFFFFFFFF as "pick one at random": both keynes paths pass 0xFFFFFFFE for it.
    passed = seed if seed != 0xFFFFFFFF else 0xFFFFFFFE
    theirs = llm.create_completion(PROMPT, max_tokens=1, seed=passed, temperature=settings["temperature"], top_k=40,
                                   top_p=0.95, min_p=0.05, repeat_penalty=1.0)["choices"][0]["text"]
    llm.reset()
    llm.eval(tokens(llm))
    logits = internals.last_logits(llm, llm.n_vocab())
    sampler = internals.completion_sampler(llm, seed, **settings)
    cells = np.zeros(llm.n_vocab(), dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    cells["logit"], cells["id"] = logits, np.arange(llm.n_vocab(), dtype=np.int32)
    arr = llama_cpp.llama_token_data_array(data=cells.ctypes.data_as(llama_cpp.llama_token_data_p), size=llm.n_vocab(),
                                           selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(internals.sampler_handle(sampler), ctypes.byref(arr))
    ours = int(arr.data[arr.selected].id)
    assert llm.detokenize([ours]).decode("utf-8", "replace") == theirs


def test_the_quiet_contexts_silence_llama_cpps_stderr_and_reraise(gguf, capfd):
    """llama.cpp writes to file descriptor 2 itself, not through Python: a vocabulary-only model
    warns there even when not verbose (what engines.llamacpp.vocabulary silences). Captured at
    the descriptor: the warning is there without ``silenced``, and nothing is within it."""
    from llama_cpp import Llama

    Llama(model_path=str(gguf), vocab_only=True, verbose=False).close()
    loud = capfd.readouterr()
    assert "n_ctx_train" in loud.err, loud  # what llama.cpp writes, so that silence below means something
    with internals.silenced():
        Llama(model_path=str(gguf), vocab_only=True, verbose=False).close()
        print("and Python's own writes", file=sys.stderr)
    quiet = capfd.readouterr()
    assert (quiet.out, quiet.err) == ("", ""), quiet
    with pytest.raises(ValueError), internals.quiet():
        raise ValueError("a load error still raises")


def test_a_prompt_past_the_context_is_refused_as_the_exact_paths_say(llm):
    """The exact paths store the error ``create_completion`` raises for a prompt longer than the
    context (``internals.too_long``), word for word, so an agent's error does not depend on the path."""
    prompt = "1 2 3 " * llm.n_ctx()
    tokens = len(llm.tokenize(prompt.encode(), special=True))
    with pytest.raises(ValueError) as raised:
        llm.create_completion(prompt, max_tokens=1)
    assert str(raised.value) == str(internals.too_long(tokens, llm.n_ctx()))
    assert internals.error_text(raised.value) == f"llama.cpp: ValueError: {raised.value}"
