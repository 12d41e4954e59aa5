"""The openai engine's ``server:`` presets: the defaults each kind of server gets, every one still
settable by hand, and a config without ``server:`` read as ``server: generic``."""

from __future__ import annotations

import numpy as np
import pytest

from engines import Constraint, parse_spec
from engines.shared_context import Chain
from engines.openai.engine import _constraint_fields, _json_answer, _shares, _texts
from engines.openai.exact import api_root, steps_of

pytestmark = pytest.mark.quick


def spec(**settings):
    return parse_spec({"kind": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "m", **settings})


@pytest.mark.parametrize("server, prompt_format, fields, shared, per_request", [
    ("generic", "completion", ("grammar", "structured_outputs"), False, 1),
    ("vllm", "completion", ("structured_outputs",), True, 1),
    ("llamacpp", "completion", ("grammar",), True, 1),
    ("openai", "chat", (), False, 128),
])
def test_each_preset_sets_its_defaults(server, prompt_format, fields, shared, per_request):
    s = spec(server=server)
    assert (s.prompt_format, s.constraint_fields, s.shared_context, s.uses_shared_context) == (prompt_format, fields, shared, shared)
    assert s.completions_per_request == s.batched_choices == per_request


def test_no_preset_is_the_generic_server_and_every_field_can_be_set_by_hand():
    assert spec() == spec(server="generic")
    assert (spec().prompt_format, spec().constraint_fields, spec().uses_shared_context) == ("completion", ("grammar", "structured_outputs"), False)
    assert spec(server="openai", completions_per_request=1).batched_choices == 1
    with pytest.raises(ValueError, match="completions_per_request"):
        spec(completions_per_request=0)
    s = spec(server="vllm", prompt_format="chat", constraint_fields=[], shared_context=False)
    assert (s.prompt_format, s.constraint_fields, s.uses_shared_context) == ("chat", (), False)
    assert spec(server="openai", constraint_fields=["response_format"]).constraint_fields == ("response_format",)
    # Presets change the engine's settings, so its key (one actor pool per distinct engine).
    assert len({spec(server=k).key for k in ("generic", "vllm", "llamacpp", "openai")}) == 4


def test_a_hosted_api_gets_its_constraint_as_a_json_schema_and_the_number_is_read_back():
    body = _constraint_fields(Constraint(0, 100, True), ("response_format",))
    schema = body["response_format"]["json_schema"]["schema"]
    assert body["response_format"]["type"] == "json_schema" and "grammar" not in body
    assert schema["properties"]["answer"] == {"type": "integer", "minimum": 0, "maximum": 100}
    assert schema["required"] == ["answer"] and schema["additionalProperties"] is False
    assert _json_answer('{"answer": 42}') == "42" and _json_answer('{"answer": 42.0}') == "42"
    assert _json_answer('{"answer": 3.5}') == "3.5" and _json_answer("42") == "42" and _json_answer('{"x": 1}') == '{"x": 1}'


def test_the_exact_path_reads_vllms_answers():
    assert api_root("http://h:8000/v1/") == "http://h:8000" and api_root("http://h:8000") == "http://h:8000"
    response = {"choices": [
        {"index": 1, "logprobs": {"top_logprobs": [{"token_id:7": 1.5, "token_id:9": -2.0}]}},
        {"index": 0, "logprobs": {"top_logprobs": [{"token_id:3": 0.25}]}},
    ]}
    assert steps_of(response, 2) == [{3: 0.25}, {7: 1.5, 9: -2.0}]


def test_a_requests_tokens_are_shared_by_its_agents_in_whole_numbers_that_sum_to_them():
    assert _shares(10, [1, 1, 1]) == [4, 3, 3] and _shares(7, [1, 1, 5]) == [1, 1, 5] and _shares(0, [2, 3]) == [0, 0]
    assert sum(_shares(1001, [3, 7, 11, 1])) == 1001 and _shares(5, []) == []


def test_choices_are_read_in_the_order_of_their_index():
    response = {"choices": [{"index": 2, "message": {"content": "c"}}, {"index": 0, "message": {"content": "a"}},
                            {"index": 1, "message": {"content": "b"}}]}
    assert _texts(response, "chat") == ["a", "b", "c"]
    assert _texts({"choices": [{"index": 1, "text": "y"}, {"index": 0, "text": "x"}]}, "completion") == ["x", "y"]
    assert _texts({}, "completion") == [""]


def test_a_node_is_settled_only_when_the_tokens_not_given_cannot_matter():
    from engines.openai.llama_server import settle

    tokens = np.array([3, 5, 7])
    # 7 is not among the 2 tokens given: at most -3.2, more than log(20) below the best, cut by min-p 0.05.
    step = {3: -0.1, 5: -2.5, 99: -3.2}
    assert np.array_equal(settle(tokens, step, 3, Chain()), [-0.1, -2.5, -np.inf])
    # Without min-p and top-k, 7 could hold mass: not settled (asked again with more).
    assert settle(tokens, step, 3, Chain(min_p=0.0, top_k=0)) is None
    # Fewer tokens than asked: every other token's probability is 0.
    assert np.array_equal(settle(tokens, {3: -0.1, 5: -2.5}, 3, Chain(min_p=0.0, top_k=0)), [-0.1, -2.5, -np.inf])
    # Greedy: settled when a given token is above the bound.
    assert settle(tokens, step, 3, Chain(temperature=0.0, min_p=0.0, top_k=0)) is not None
    assert settle(tokens, {99: -0.1, 98: -0.2}, 2, Chain()) is None  # no answer token given at all


def test_the_exact_path_reads_llama_servers_answers():
    from engines.openai.llama_server import step_body, top_probs

    body = step_body([2, 10], (7, 8), Chain(), 64)
    assert body["prompt"] == [2, 10, 7, 8] and body["samplers"] == ["penalties"] and body["post_sampling_probs"] is True
    assert (body["repeat_penalty"], body["repeat_last_n"], body["n_probs"], body["n_predict"]) == (1.1, 2, 64, 1)
    assert step_body([2], (), Chain(), 8)["repeat_last_n"] == 0  # the root: nothing generated to penalize
    assert step_body([2], (7,), Chain(repeat_penalty=1.0), 8)["repeat_penalty"] == 1.0
    response = {"completion_probabilities": [{"id": 7, "prob": 0.5, "top_probs": [{"id": 7, "prob": 0.5}, {"id": 3, "prob": 0.25}, {"id": 4, "prob": 0.0}]}]}
    assert top_probs(response) == {7: np.log(0.5), 3: np.log(0.25)}
