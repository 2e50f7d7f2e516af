"""The sampled tokens' surprisals the gateway reads from a non-vLLM engine's logprobs (what the
gibberish detector compares with the entropy), hand-computed."""

from __future__ import annotations

import math

import pytest
from entroloop.collectors.gateway.logprobs import approximate_measures
from entroloop.collectors.gateway.topk_entropy import surprisal_from_logprobs


def test_surprisal_is_taken_under_the_renormalised_top_k() -> None:
    top = [math.log(0.5), math.log(0.25), math.log(0.25)]
    assert surprisal_from_logprobs(math.log(0.25), top) == pytest.approx(math.log(4))
    # the top 2 hold 0.8 of the mass: renormalised, the sampled 0.4 is 0.5
    assert surprisal_from_logprobs(math.log(0.4), [math.log(0.4), math.log(0.4)]) == pytest.approx(math.log(2))
    # a token sampled outside the top k keeps its own logprob: 0.1 of 0.8 -> ln 8
    assert surprisal_from_logprobs(math.log(0.1), [math.log(0.4), math.log(0.4)]) == pytest.approx(math.log(8))
    assert math.isnan(surprisal_from_logprobs(None, top)) and math.isnan(surprisal_from_logprobs(0.0, []))


def _chat(entries: list[dict]) -> dict:
    return {"choices": [{"index": 0, "logprobs": {"content": entries}}]}


def test_chat_surprisals_line_up_with_entropies_or_are_left_out() -> None:
    entries = [{"token": "a", "logprob": math.log(0.5), "top_logprobs": [{"token": "a", "logprob": math.log(0.5)},
                                                                        {"token": "b", "logprob": math.log(0.5)}]},
               {"token": "c", "logprob": math.log(0.2), "top_logprobs": [{"token": "d", "logprob": math.log(0.8)},
                                                                        {"token": "c", "logprob": math.log(0.2)}]}]
    path = "/v1/chat/completions"
    entropies, surprisals = approximate_measures(path, _chat(entries))
    assert len(surprisals) == len(entropies) == 2
    assert entropies == pytest.approx([math.log(2), -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))])
    assert surprisals == pytest.approx([math.log(2), -math.log(0.2)])
    entries[1]["logprob"] = None  # one token without its own logprob: none rather than misaligned ones
    assert approximate_measures(path, _chat(entries)) == (pytest.approx(entropies), None)


def test_completion_surprisals_from_token_logprobs() -> None:
    data = {"choices": [{"index": 0, "logprobs": {"tokens": ["x", "y"], "token_logprobs": [math.log(0.5), math.log(0.25)],
                                                  "top_logprobs": [{"x": math.log(0.5), "z": math.log(0.5)},
                                                                   {"y": math.log(0.25), "w": math.log(0.75)}]}}]}
    assert approximate_measures("/v1/completions", data)[1] == pytest.approx([math.log(2), math.log(4)])
