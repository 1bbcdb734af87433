"""The decoding controls of `generate` on GPT-2 (a decoder-only model):
`min_new_tokens`, `repetition_penalty`, `no_repeat_ngram_size`,
`bad_words_ids`, per-row `max_new_tokens` and `return_scores`.

Our `GPTCausalLM.generate` is compared against `transformers`'
`GPT2LMHeadModel.generate` on the same tiny random checkpoint: greedy
decoding and beam search token for token (each prompt generated alone by
`transformers`, ours on a right-padded batch of prompts of different
lengths), and the scores against `compute_transition_scores` (and
`sequences_scores`). Sampled tokens' scores are checked against an
independent recomputation: `transformers`' forward pass over our sampled
sequence, put through `transformers`' own logits processors and warpers.
Every control value is chosen from the unconstrained reference output so
that it changes that output (asserted), and the arguments' checks are
exercised; a second call with the same controls and shapes compiles
nothing new."""

import logging

import keras
import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras.backend_support import recorded_steps
from attention_zoo_keras.models.gpt import GPTCausalLM
from tests.support.gpt_decoding import PROMPTS
from tests.support.gpt_decoding import right_padded_inputs

NEW_TOKENS = 10
ATOL = 1e-4


class Reference:
    """`transformers`' GPT-2 and tokenizer of the tiny checkpoint, with
    memoised batch-1 `generate` calls (returning scores too)."""

    def __init__(self, path):
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
        self.prompts = [self.tokenizer(p)["input_ids"] for p in PROMPTS]
        self._outputs = {}

    def generate(self, prompt, num_beams=1, stop=None, max_new_tokens=NEW_TOKENS, **controls):
        """`transformers`' generate output (a `GenerateOutput` with scores) for one prompt."""
        key = (tuple(prompt), num_beams, stop, max_new_tokens, repr(sorted(controls.items())))
        if key not in self._outputs:
            input_ids = torch.tensor([prompt])
            with torch.no_grad():
                self._outputs[key] = self.model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    do_sample=False,
                    num_beams=num_beams,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=self.tokenizer.eos_token_id,
                    eos_token_id=stop,
                    return_dict_in_generate=True,
                    output_scores=True,
                    **controls,
                )
        return self._outputs[key]

    def rows(self, num_beams=1, stop=None, **controls):
        """Each prompt with its continuation (id lists), generated one prompt at a time."""
        return [self.generate(p, num_beams, stop, **controls).sequences[0].tolist() for p in self.prompts]

    def generated(self, num_beams=1, stop=None, **controls):
        """The generated part of each of `rows`."""
        return [row[len(p):] for row, p in zip(self.rows(num_beams, stop, **controls), self.prompts)]

    def transition_scores(self, prompt, num_beams=1, stop=None, **controls):
        """`compute_transition_scores` of one prompt's output: log-softmax of the
        processed scores (greedy), the processed beam log-probabilities (beam)."""
        out = self.generate(prompt, num_beams, stop, **controls)
        if num_beams == 1:
            scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        else:
            scores = self.model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
        return scores[0].numpy()


@pytest.fixture(scope="module")
def lm(tiny_gpt2_checkpoints):
    return GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))


@pytest.fixture(scope="module")
def reference(tiny_gpt2_checkpoints):
    return Reference(tiny_gpt2_checkpoints["lm"])


def _rows(output):
    """Our output rows as id lists (padding dropped)."""
    return [ids[mask.astype(bool)].tolist() for ids, mask in zip(output["token_ids"], output["padding_mask"])]


def _ngrams(row, n):
    """The n-grams of `row`, in order."""
    return [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]


def _repeats_an_ngram(row, n):
    """Whether some n-gram occurs twice in `row`."""
    grams = _ngrams(row, n)
    return len(set(grams)) < len(grams)


def _stop_token(reference, num_beams):
    """A stop token the unconstrained output of the first prompt emits as
    its second token: stopping on it ends that row at once."""
    return reference.generated(num_beams)[0][1]


def _bad_words(reference, num_beams):
    """`bad_words_ids` taken from the unconstrained output: the first token
    of the second prompt's continuation (banned everywhere), the second and
    third tokens of the first prompt's (the third banned after the second),
    the first three of the third prompt's, and the first prompt's last token
    with the first token it continues with (a prefix in the prompt: the
    rows of a right-padded batch end their prompts at different places).
    Each entry alone changes the reference output."""
    generated = reference.generated(num_beams)
    entries = [
        [generated[1][0]],
        generated[0][1:3],
        generated[2][0:3],
        [reference.prompts[0][-1], generated[0][0]],
    ]
    for entry in entries:
        assert reference.generated(num_beams, bad_words_ids=[entry]) != generated, f"{entry} does not matter"
    return entries


def _case(reference, name, num_beams):
    """`(controls, stop)`: the `generate` arguments of the case `name` and
    the stop token (or None), chosen so that the controls change the
    reference output (asserted)."""
    stop = None
    if name == "min_new_tokens":
        stop = _stop_token(reference, num_beams)
        controls = {"min_new_tokens": 4}
    elif name.startswith("repetition_penalty"):
        controls = {"repetition_penalty": float(name.split("=")[1])}
    elif name.startswith("no_repeat_ngram_size"):
        n = int(name.split("=")[1])
        controls = {"no_repeat_ngram_size": n}
        assert any(_repeats_an_ngram(row, n) for row in reference.rows(num_beams))
        assert not any(_repeats_an_ngram(row, n) for row in reference.rows(num_beams, **controls))
    elif name == "bad_words_ids":
        # And an entry that bans nothing, unless padding is read as tokens: the
        # end token (GPT-2's padding id, also at the end of the padded buffer),
        # the fourth prompt's single token, then its first continuation token.
        assert len(reference.prompts[3]) == 1
        probe = [reference.tokenizer.eos_token_id, *reference.prompts[3], reference.generated(num_beams)[3][0]]
        assert reference.generated(num_beams, bad_words_ids=[probe]) == reference.generated(num_beams)
        controls = {"bad_words_ids": [*_bad_words(reference, num_beams), probe]}
    else:  # all four, and a one-token entry that is the stop id (ignored, as in transformers)
        stop = _stop_token(reference, num_beams)
        controls = {
            "min_new_tokens": 3,
            "repetition_penalty": 1.3,
            "no_repeat_ngram_size": 3,
            "bad_words_ids": [*_bad_words(reference, num_beams), [stop]],
        }
        assert stop not in [entry[0] for entry in controls["bad_words_ids"][:-1] if len(entry) == 1]
        # The stop still ends some row: the one-token entry naming it must be ignored.
        assert any(row[-1] == stop for row in reference.generated(num_beams, stop, **controls))
    assert reference.rows(num_beams, stop, **controls) != reference.rows(num_beams, stop), f"{name} does not matter"
    return controls, stop


# Each control alone (the combination of all four: `test_combined_controls_and_scores_match_transformers`).
# Beam search takes one value of the penalty and the n-gram size alone (the
# combination has the others), to keep the number of compiled loops small.
GREEDY_CASES = [
    "min_new_tokens",
    "repetition_penalty=1.5",
    "repetition_penalty=0.7",
    "no_repeat_ngram_size=2",
    "no_repeat_ngram_size=3",
    "bad_words_ids",
]
BEAM_CASES = ["min_new_tokens", "repetition_penalty=0.7", "no_repeat_ngram_size=2", "bad_words_ids"]


def _generate(lm, reference, num_beams, stop, **arguments):
    """Ours on the right-padded batch of all prompts."""
    beam = {"num_beams": num_beams} if num_beams > 1 else {}
    return lm.generate(
        right_padded_inputs(reference.prompts),
        max_new_tokens=NEW_TOKENS,
        stop_token_ids=None if stop is None else [stop],
        **beam,
        **arguments,
    )


@pytest.mark.parametrize(
    "name, num_beams",
    [(name, 1) for name in GREEDY_CASES] + [(name, 3) for name in BEAM_CASES],
    ids=[f"greedy-{name}" for name in GREEDY_CASES] + [f"beam-{name}" for name in BEAM_CASES],
)
def test_each_control_matches_transformers(lm, reference, name, num_beams):
    controls, stop = _case(reference, name, num_beams)
    expected = reference.rows(num_beams, stop, **controls)
    assert _rows(_generate(lm, reference, num_beams, stop, **controls)) == expected


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam"])
def test_combined_controls_and_scores_match_transformers(lm, reference, num_beams):
    """All four controls together: the same tokens, each generated token's
    score as `compute_transition_scores`, 0 at prompt and padding
    positions, and (beam search, with a length penalty) the sequence scores
    as `sequences_scores`."""
    controls, stop = _case(reference, "combined", num_beams)
    if num_beams > 1:
        controls["length_penalty"] = 0.6
    result = _generate(lm, reference, num_beams, stop, return_scores=True, **controls)
    assert _rows(result) == reference.rows(num_beams, stop, **controls)
    scores, mask = result["scores"], result["padding_mask"].astype(bool)
    assert scores.dtype == np.float32 and scores.shape == result["token_ids"].shape
    for row, prompt in enumerate(reference.prompts):
        expected = reference.transition_scores(prompt, num_beams, stop, **controls)
        generated = np.flatnonzero(mask[row])[len(prompt):]
        assert len(generated) == len(expected)
        np.testing.assert_allclose(scores[row, generated], expected, atol=ATOL, err_msg=f"prompt {row}")
        elsewhere = np.ones(scores.shape[1], bool)
        elsewhere[generated] = False
        np.testing.assert_array_equal(scores[row, elsewhere], 0.0)
    if num_beams > 1:
        expected = [reference.generate(p, num_beams, stop, **controls).sequences_scores[0].item()
                    for p in reference.prompts]
        assert result["sequence_scores"].shape == (len(PROMPTS),)
        np.testing.assert_allclose(result["sequence_scores"], expected, atol=ATOL)
    else:
        assert "sequence_scores" not in result


SAMPLERS = {
    "top_k": ({"sampler": "top_k", "k": 5, "temperature": 0.7},
              [transformers.TemperatureLogitsWarper(0.7), transformers.TopKLogitsWarper(5)]),
    "top_p": ({"sampler": "top_p", "p": 0.8, "temperature": 1.3},
              [transformers.TemperatureLogitsWarper(1.3), transformers.TopPLogitsWarper(0.8)]),
}


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_sampled_scores_are_the_warped_log_probabilities(lm, reference, sampler):
    """A sampler with every control: each sampled token's score is the
    log-softmax, at its position, of `transformers`' forward pass over our
    sampled sequence put through `transformers`' processors (the controls)
    and warpers (temperature, then top-k or top-p); no banned word,
    repeated 3-gram or early stop appears."""
    options, warpers = SAMPLERS[sampler]
    stop = _stop_token(reference, 1)
    bad_words = [*_bad_words(reference, 1), [stop]]
    controls = {"min_new_tokens": 3, "repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "bad_words_ids": bad_words}
    result = _generate(lm, reference, 1, stop, seed=0, return_scores=True, **options, **controls)
    stop_tensor = torch.tensor([stop])
    for row, (ids, prompt) in enumerate(zip(_rows(result), reference.prompts)):
        processors = transformers.LogitsProcessorList([
            transformers.RepetitionPenaltyLogitsProcessor(1.3),
            transformers.NoRepeatNGramLogitsProcessor(3),
            transformers.NoBadWordsLogitsProcessor(bad_words, eos_token_id=stop),
            transformers.MinNewTokensLengthLogitsProcessor(len(prompt), 3, stop_tensor),
            *warpers,
        ])
        with torch.no_grad():
            logits = reference.model(torch.tensor([ids])).logits[0]
            expected = [
                torch.log_softmax(processors(torch.tensor([ids[:t]]), logits[t - 1 : t].clone()), -1)[0, ids[t]].item()
                for t in range(len(prompt), len(ids))
            ]
        positions = np.flatnonzero(result["padding_mask"][row])[len(prompt):]
        np.testing.assert_allclose(result["scores"][row, positions], expected, atol=ATOL, err_msg=f"prompt {row}")
        # The controls hold (the finite scores above already say so; here directly).
        assert stop not in ids[len(prompt) : len(prompt) + 3]
        for entry in bad_words[:-1]:  # (the last, [stop], is ignored)
            ends = [i + len(entry) for i, gram in enumerate(_ngrams(ids, len(entry))) if list(gram) == entry]
            assert all(end <= len(prompt) for end in ends), f"{entry} generated"
        assert not _repeats_an_ngram(ids, 3)


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam"])
def test_max_new_tokens_per_row(lm, reference, num_beams):
    """Each row of a call with one `max_new_tokens` per prompt equals that
    prompt generated alone with its own value. (With a control: the
    settings of a case above, whose compiled loop this reuses.)"""
    counts = [3, 7, 1, 5]
    options = {"no_repeat_ngram_size": 2, "stop_token_ids": None, **({"num_beams": num_beams} if num_beams > 1 else {})}
    result = lm.generate(right_padded_inputs(reference.prompts), max_new_tokens=counts, **options)
    for row, (prompt, count) in enumerate(zip(reference.prompts, counts)):
        alone = lm.generate(right_padded_inputs([prompt]), max_new_tokens=count, **options)
        assert _rows(result)[row] == _rows(alone)[0], f"prompt {row}"
        assert len(_rows(result)[row]) == len(prompt) + count


def test_scores_of_text_input(lm, reference):
    """Text input with `return_scores`: a dict whose `text` is what
    `generate` returns without it, and whose scores are greedy's."""
    result = lm.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, stop_token_ids=None, return_scores=True)
    assert result["text"] == lm.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    prompt = reference.prompts[0]
    assert _rows(result) == [reference.rows()[0]]
    np.testing.assert_allclose(result["scores"][0, len(prompt):], reference.transition_scores(prompt), atol=ATOL)
    np.testing.assert_array_equal(result["scores"][0, : len(prompt)], 0.0)


ERRORS = [
    ({"min_new_tokens": -1}, "min_new_tokens"),
    ({"min_new_tokens": 1.5}, "min_new_tokens"),
    ({"min_new_tokens": "2"}, "min_new_tokens"),
    ({"no_repeat_ngram_size": -2}, "no_repeat_ngram_size"),
    ({"no_repeat_ngram_size": 2.0}, "no_repeat_ngram_size"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.2}, "repetition_penalty"),
    ({"repetition_penalty": "high"}, "repetition_penalty"),
    ({"bad_words_ids": []}, "bad_words_ids"),
    ({"bad_words_ids": [[]]}, "bad_words_ids"),
    ({"bad_words_ids": [5, 6]}, "bad_words_ids"),
    ({"bad_words_ids": [["the"]]}, "bad_words_ids"),
    ({"bad_words_ids": [[5, 1.5]]}, "bad_words_ids"),
    ({"bad_words_ids": [[5], [400]]}, "(?s)bad_words_ids.*320|320.*bad_words_ids"),  # names the vocabulary size
    ({"bad_words_ids": [[5], [320]]}, "bad_words_ids"),
    ({"bad_words_ids": [[5, -1]]}, "bad_words_ids"),
    ({"max_new_tokens": [3, 4, 5]}, "max_new_tokens"),
    ({"max_new_tokens": [3, 4, 5, 6, 7]}, "max_new_tokens"),
]


@pytest.mark.parametrize("arguments, message", ERRORS, ids=[repr(a) for a, _ in ERRORS])
def test_bad_arguments_are_named(lm, reference, arguments, message):
    assert lm.backbone.vocabulary_size == 320  # (the out-of-vocabulary ids above)
    arguments = {"max_new_tokens": 2, **arguments}
    with pytest.raises((ValueError, TypeError), match=message):
        lm.generate(right_padded_inputs(reference.prompts), **arguments)


def test_scores_cannot_be_streamed(lm):
    class Streamer:
        def put(self, value):
            pass

        def end(self):
            pass

    with pytest.raises((ValueError, TypeError), match="return_scores"):
        lm.generate(PROMPTS[0], max_new_tokens=2, return_scores=True, stream=True)
    with pytest.raises((ValueError, TypeError), match="return_scores"):
        lm.generate(PROMPTS[0], max_new_tokens=2, return_scores=True, streamer=Streamer())


def _count_calls(monkeypatch, owner, name):
    """A list that grows by one entry (the keyword arguments) per call of `owner.name`."""
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_second_call_with_the_same_controls_compiles_nothing(tiny_gpt2_checkpoints, reference, monkeypatch,
                                                                caplog):
    """JAX and TensorFlow trace the model's step only while compiling the
    loop; torch records the loop's body once per input signature
    (`recorded_steps._jit_trace`), whole: the controls do not branch on a
    tensor's value. A second call of the same controls and shapes (other
    prompts of the same lengths) does neither."""
    caplog.set_level(logging.INFO, logger="attention_zoo_keras")
    fresh = GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))
    if keras.backend.backend() == "torch":
        traces = _count_calls(monkeypatch, recorded_steps, "_jit_trace")
    else:
        traces = _count_calls(monkeypatch, fresh, "_next_token_logits")
    controls = {
        "min_new_tokens": 2, "repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "bad_words_ids": [[7], [8, 9]]
    }
    prompts = right_padded_inputs(reference.prompts)
    first = fresh.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=[0], return_scores=True, **controls)
    traced = len(traces)
    assert traced > 0
    shifted = (prompts["token_ids"] * 7 + 3) % 300 * prompts["padding_mask"]
    other = {"token_ids": shifted.astype("int32"), "padding_mask": prompts["padding_mask"]}
    second = fresh.generate(other, max_new_tokens=NEW_TOKENS, stop_token_ids=[0], return_scores=True, **controls)
    assert len(traces) == traced
    assert _rows(first) != _rows(second)  # it did decode the other prompts
    assert "not recorded whole" not in caplog.text
