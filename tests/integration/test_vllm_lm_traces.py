"""Traces of a real (tiny) language model through the real vLLM CPU engine and the entropy tap.

The model (``tests.corpora.tiny_lm``) is trained once on Debian's zh_CN gettext catalogs and cached
under ~/.cache/entroloop; this test regenerates a few of the requests behind
``tests/data/entropy/lm_traces_{dev,test}.jsonl`` and checks what that file claims about them:

* the tap ships one entropy per generated token, and each equals a float64 transformers forward
  pass over the prompt and the token ids vLLM returned (so entropies and ids belong together);
* greedy decoding falls into loops that the text labeller sees (a phrase repeated verbatim), the
  token ids end periodically and the entropies repeat with the same period — but they are not
  low: this model's loops run through message boundaries where it is unsure (~3.5 nats mean);
* sampling at high temperature gives text the labeller calls gibberish, at higher entropy than
  greedy text;
* vLLM's logprob of each sampled token (raw, before temperature) is its surprisal under a float64
  forward pass, and high-temperature text is far more surprising than the model's own entropy
  while greedy text is less (the gibberish evidence the entropy alone cannot give);
* with the same cached model, the regenerated requests reproduce the checked-in lines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.vllm

# float16 on the wire: half an ulp is 2**-11 * value, <= 0.004 nats below 8 nats; float32 logits
# add less than that. 0.01 still catches an entropy taken at the wrong position (they differ by
# nats from one token to the next).
TOLERANCE = 0.01
PER_REGIME = 4  # requests regenerated per regime (both languages)


@pytest.fixture(scope="module")
def model_folder() -> Path:
    from tests.corpora.tiny_lm import tiny_lm

    return tiny_lm()


@pytest.fixture(scope="module")
def regenerated(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from tests.corpora import lm_traces

    chosen = []
    for regime in ("greedy", "very-hot"):
        of_regime = [r for r in lm_traces.plan_requests() if r.regime.name == regime]
        en = [r for r in of_regime if r.lang == "en"][: PER_REGIME // 2]
        zh = [r for r in of_regime if r.lang == "zh"][: PER_REGIME // 2]
        chosen += en + zh
    sink = tmp_path_factory.mktemp("lm-sink")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in lm_traces.tap_environment(sink).items():
            patch.setenv(key, value)
        llm = lm_traces.start_engine(model_folder)
        try:
            traces = lm_traces.generate(llm, chosen, sink)
        finally:
            lm_traces.stop_engine(llm)
    lex = lm_traces.lexicon()
    lines = [lm_traces.to_line(t, lex, model_folder) for t in traces]
    return {"traces": traces, "lines": lines}


def by_regime(regenerated: dict, regime: str) -> list[tuple[dict, dict]]:
    return [
        (t, l)
        for t, l in zip(regenerated["traces"], regenerated["lines"])
        if t["request"].regime.name == regime
    ]


def test_tap_entropies_belong_to_the_returned_token_ids(
    model_folder: Path, regenerated: dict
) -> None:
    from tests.integration.vllm_tiny_model import reference_entropies

    worst = 0.0
    for trace in regenerated["traces"]:
        assert (
            len(trace["entropy"])
            == len(trace["token_ids"])
            == trace["request"].max_tokens
        )
        expected = np.array(
            reference_entropies(
                model_folder, trace["prompt_token_ids"], trace["token_ids"]
            )
        )
        error = np.abs(np.array(trace["entropy"]) - expected)
        worst = max(worst, float(error.max()))
        assert error.max() <= TOLERANCE, (
            trace["id"],
            int(error.argmax()),
            trace["entropy"][:8],
            expected[:8],
        )
    print(f"worst |tap - reference| = {worst:.4f} nats")


def test_surprisals_are_the_sampled_tokens_own_and_exceed_entropy_only_when_hot(
    model_folder: Path, regenerated: dict
) -> None:
    from tests.integration.vllm_tiny_model import reference_surprisals

    for trace in regenerated["traces"]:
        expected = np.array(
            reference_surprisals(model_folder, trace["prompt_token_ids"], trace["token_ids"])
        )
        # logprobs are float32 from vLLM and rounded to 4 decimals here; a surprisal taken at the
        # wrong position or under temperature is off by nats
        error = np.abs(np.array(trace["surprisal"]) - expected)
        assert error.max() <= 0.05, (trace["id"], int(error.argmax()))
        # The tap ships the same surprisals itself (gathered one step late from the logits it kept),
        # so a node without the gateway's logprobs still has the gibberish evidence.
        assert len(trace["tap_surprisal"]) == len(expected), trace["id"]
        tap_error = np.abs(np.array(trace["tap_surprisal"]) - expected)
        assert tap_error.max() <= 0.02 + 2e-3 * expected.max(), (trace["id"], int(tap_error.argmax()))
    excess = {
        regime: [
            float(np.median(np.array(t["surprisal"]) - np.array(t["entropy"])))
            for t, _ in by_regime(regenerated, regime)
        ]
        for regime in ("greedy", "very-hot")
    }
    assert max(excess["greedy"]) < 0, excess  # greedy picks tokens the model was surer of than average
    assert min(excess["very-hot"]) > 2.0, excess  # T=2.0 keeps drawing tokens the model found unlikely


def token_period(token_ids: list[int], max_period: int = 64) -> int | None:
    """The shortest period with which the token ids end (at least three copies), or None."""
    for period in range(1, max_period + 1):
        span = 3 * period
        if (
            span <= len(token_ids)
            and token_ids[-span:-period] == token_ids[-span + period :]
        ):
            return period
    return None


def test_greedy_decoding_loops_and_its_entropy_repeats_with_the_loop(
    regenerated: dict,
) -> None:
    from tests.corpora.text_labels import loop_evidence, normalise

    greedy = by_regime(regenerated, "greedy")
    assert len(greedy) == PER_REGIME
    loops = [(trace, line) for trace, line in greedy if line["label"]["loop"]]
    # In the checked-in file 59 of 68 greedy requests loop by the text rule (the others alternate
    # between two messages, which an exact period does not catch).
    assert len(loops) >= PER_REGIME - 1, [t["text"][-80:] for t, _ in greedy]
    for trace, _ in loops:
        evidence = loop_evidence(trace["text"])
        assert evidence is not None and evidence.repeats >= 3
        # Greedy never leaves a loop: the repeated stretch is the text's tail, and so are the ids.
        assert evidence.start + evidence.length >= len(normalise(trace["text"])) - 1
        period = token_period(trace["token_ids"])
        assert period is not None, trace["token_ids"][-40:]
        # Same context, same distribution: each position of the cycle keeps its entropy. The loop
        # is NOT uniformly low-entropy with this model (it cycles through message boundaries
        # where the next message is uncertain), so detectors must not rely on that.
        values = np.array(trace["entropy"])
        assert np.abs(values[-2 * period : -period] - values[-period:]).max() < 0.5, (
            period,
            values[-2 * period :],
        )


def test_high_temperature_gives_gibberish_at_higher_entropy_than_greedy(
    regenerated: dict,
) -> None:
    hot = by_regime(regenerated, "very-hot")
    assert len(hot) == PER_REGIME
    for trace, line in hot:
        assert line["label"]["gibberish"], ("hot text reads as words", trace["text"])
        assert not line["label"]["loop"]
    # The tap measures the model's own distribution (before temperature): word salad puts the model
    # out of its depth, so it is less sure of every next token than on its own greedy text.
    hot_means = [np.mean(t["entropy"]) for t, _ in hot]
    greedy_means = [np.mean(t["entropy"]) for t, _ in by_regime(regenerated, "greedy")]
    assert np.median(hot_means) > np.median(greedy_means) + 0.2, (
        hot_means,
        greedy_means,
    )


def test_regenerated_requests_reproduce_the_checked_in_lines(
    model_folder: Path, regenerated: dict
) -> None:
    from tests.corpora.lm_traces import read_lines

    checked_in = read_lines()
    first = next(iter(checked_in.values()))
    if first["generator"]["model_folder"] != model_folder.name:
        pytest.skip(
            f"the cached model {model_folder.name} is not the one that generated the checked-in traces "
            f"({first['generator']['model_folder']}): different catalog versions, config or code; "
            "rerun `python -m tests.corpora.lm_traces` to regenerate the file"
        )
    for line in regenerated["lines"]:
        stored = checked_in[line["id"]]
        assert stored["generator"]["prompt"] == line["generator"]["prompt"]
        assert stored["token_ids"] == line["token_ids"], line["id"]
        assert stored["label"] == line["label"], line["id"]
        assert np.abs(np.array(stored["surprisal"]) - np.array(line["surprisal"])).max() <= TOLERANCE
        assert (
            np.abs(np.array(stored["entropy"]) - np.array(line["entropy"])).max()
            <= TOLERANCE
        )
