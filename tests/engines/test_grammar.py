"""The GBNF grammar of an answer: the same language as ``number_regex``, valid for llama.cpp."""

from __future__ import annotations

import re

import pytest

from prompts.answers import number_gbnf, number_regex

pytestmark = pytest.mark.quick

RANGES = [(0, 100, True), (0, 100, False), (10, 250, True), (0, 1, False), (5, 5, True), (1, 1000, True), (0, 30, False)]


def gbnf_as_regex(grammar: str) -> str:
    """Read the ``number`` rule back as a Python regex (the translator's inverse)."""
    rule = grammar.split("number ::= ", 1)[1].strip()
    rule = re.sub(r'"(\.|\d| )"', lambda m: re.escape(m.group(1)), rule)
    return rule.replace("(", "(?:").replace(" ", "")


def candidates() -> list[str]:
    ints = [str(i) for i in range(0, 1101)]
    decimals = [f"{i}.{d}" for i in range(0, 102) for d in ("0", "5", "05", "25", "99", "123")]
    return ints + decimals + ["", "-1", "007", "05", "1.", ".5", "100.0", "100.00", "1e2", " 50"]


@pytest.mark.parametrize("low, high, integer", RANGES)
def test_grammar_accepts_exactly_the_allowed_answers(low, high, integer):
    grammar = number_gbnf(low, high, integer)
    expected = re.compile(number_regex(low, high, integer))
    translated = re.compile(gbnf_as_regex(grammar))
    for text in candidates():
        assert bool(translated.fullmatch(text)) == bool(expected.fullmatch(text)), (text, grammar)


@pytest.fixture(scope="module")
def vocab(gguf):
    """Gemma's vocabulary only (no weights): enough for llama.cpp to parse a grammar."""
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
    yield llm._model.vocab
    llm.close()


def parses(vocab, grammar: str) -> bool:
    import llama_cpp

    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        return False
    llama_cpp.llama_sampler_free(sampler)
    return True


@pytest.mark.llm
@pytest.mark.parametrize("low, high, integer", RANGES)
def test_llama_cpp_parses_the_grammar(vocab, low, high, integer):
    grammar = number_gbnf(low, high, integer)
    assert grammar.startswith('root ::= " "? number\n')
    assert parses(vocab, grammar)
    assert not parses(vocab, grammar.replace(")", "", 1))  # the check can fail


def test_integer_grammar_for_the_paper_game():
    assert number_gbnf(0, 100) == (
        'root ::= " "? number\n'
        'number ::= ([0-9] | "1" ([0-9]) | [2-8] [0-9]{1} | "9" ([0-9]) | "1" ("0" ("0")))\n'
    )
