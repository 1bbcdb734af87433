"""The decoding controls of `generate` on an encoder-decoder: our
`TransformerSeq2SeqLM`, converted from a tiny random `transformers`
MarianMTModel, against `MarianMTModel.generate` on the same checkpoint.

Greedy decoding and beam search with `repetition_penalty`,
`no_repeat_ngram_size`, `bad_words_ids` and `min_new_tokens` together give
the same translations token for token; each control demonstrably matters
(leaving any one out changes the reference translations). With
`return_scores`, each generated token's score equals `transformers`'
`compute_transition_scores` (and beam search's sequence scores its
`sequences_scores`).

Marian's own generation rules are matched as in test_marian_parity.py: the
reference bans `<pad>` (`bad_words_ids=[[pad]]`, which real Marian configs
carry and which our model applies by itself) and forces `</s>` at the last
position (`forced_eos_token_id` of the checkpoint). For an encoder-decoder
the decoder start token is the prompt, as in `transformers`."""

import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM

SOURCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "Where is the old bridge?",
]
MAX_LENGTH = 12
ATOL = 1e-4
CONTROL_NAMES = ["min_new_tokens", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids"]


class Reference:
    """`transformers`' MarianMTModel and tokenizer of the tiny checkpoint,
    with memoised `generate` calls on all sources (returning scores)."""

    def __init__(self, path):
        self.tokenizer = transformers.MarianTokenizer.from_pretrained(path)
        self.model = transformers.MarianMTModel.from_pretrained(path).eval()
        self.pad = self.tokenizer.pad_token_id
        self._outputs = {}

    def generate(self, num_beams, stops, **controls):
        """`transformers`' generate output for all sources; our `bad_words_ids`
        are added to Marian's ban of `<pad>`."""
        key = (num_beams, tuple(stops), repr(sorted(controls.items())))
        if key not in self._outputs:
            controls = dict(controls)
            bad_words = [[self.pad], *controls.pop("bad_words_ids", [])]
            batch = self.tokenizer(SOURCES, return_tensors="pt", padding=True)
            with torch.no_grad():
                self._outputs[key] = self.model.generate(
                    **batch,
                    max_length=MAX_LENGTH,
                    do_sample=False,
                    num_beams=num_beams,
                    eos_token_id=list(stops),
                    bad_words_ids=bad_words,
                    return_dict_in_generate=True,
                    output_scores=True,
                    **controls,
                )
        return self._outputs[key]

    def rows(self, num_beams, stops, **controls):
        """Each translation: the start token (`<pad>`), then the tokens up to the
        stop (`transformers` pads finished rows with `<pad>`, which is never generated)."""
        output = self.generate(num_beams, stops, **controls).sequences.tolist()
        return [row[:1] + [token for token in row[1:] if token != self.pad] for row in output]

    def transition_scores(self, num_beams, stops, **controls):
        """`compute_transition_scores` `(batch, steps)`: log-softmax of the processed
        scores (greedy), the processed beam log-probabilities (beam)."""
        out = self.generate(num_beams, stops, **controls)
        if num_beams == 1:
            return self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True).numpy()
        return self.model.compute_transition_scores(out.sequences, out.scores, out.beam_indices).numpy()


@pytest.fixture(scope="module")
def reference(tiny_marian_checkpoint):
    return Reference(tiny_marian_checkpoint)


@pytest.fixture(scope="module")
def mt(tiny_marian_checkpoint):
    return TransformerSeq2SeqLM.from_preset(str(tiny_marian_checkpoint))


def _rows(output):
    """Our output rows as id lists (padding dropped)."""
    return [ids[mask.astype(bool)].tolist() for ids, mask in zip(output["token_ids"], output["padding_mask"])]


def _combined(reference, num_beams):
    """`(controls, stops)`: all four controls, with ids taken from the
    unconstrained translations, and the stop ids `</s>` and a token the
    first translation emits second. Leaving any control out changes the
    reference translations (asserted)."""
    plain = [row[1:] for row in reference.rows(num_beams, [0])]
    stops = [0, plain[0][1]]
    controls = {
        "min_new_tokens": 4,
        "repetition_penalty": 1.2,
        "no_repeat_ngram_size": 2,
        "bad_words_ids": [[plain[1][0]], plain[2][1:3]],
    }
    expected = reference.rows(num_beams, stops, **controls)
    for name in CONTROL_NAMES:
        without = {key: value for key, value in controls.items() if key != name}
        assert reference.rows(num_beams, stops, **without) != expected, f"{name} does not matter"
    return controls, stops


def _generate(mt, num_beams, stops, **arguments):
    beam = {"num_beams": num_beams} if num_beams > 1 else {}
    return mt.generate(
        mt.preprocessor.pack_sources(SOURCES), max_length=MAX_LENGTH, stop_token_ids=stops, **beam, **arguments
    )


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam"])
def test_controls_match_transformers(mt, reference, num_beams):
    controls, stops = _combined(reference, num_beams)
    assert _rows(_generate(mt, num_beams, stops, **controls)) == reference.rows(num_beams, stops, **controls)


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam"])
def test_scores_match_transition_scores(mt, reference, num_beams):
    """With the controls: the same tokens, each generated token's score as
    `compute_transition_scores`, 0 at the start token and at padding, and
    (beam search) the sequence scores as `sequences_scores`."""
    controls, stops = _combined(reference, num_beams)
    result = _generate(mt, num_beams, stops, return_scores=True, **controls)
    expected_rows = reference.rows(num_beams, stops, **controls)
    assert _rows(result) == expected_rows
    expected = reference.transition_scores(num_beams, stops, **controls)
    scores, mask = result["scores"], result["padding_mask"].astype(bool)
    assert scores.dtype == np.float32 and scores.shape == result["token_ids"].shape
    assert len({len(row) for row in expected_rows}) > 1  # rows of different lengths: padding to check
    for row, expected_row in enumerate(expected_rows):
        generated = np.flatnonzero(mask[row])[1:]
        assert len(generated) == len(expected_row) - 1
        np.testing.assert_allclose(
            scores[row, generated], expected[row, : len(generated)], atol=ATOL, err_msg=f"source {row}"
        )
        elsewhere = np.ones(scores.shape[1], bool)
        elsewhere[generated] = False
        np.testing.assert_array_equal(scores[row, elsewhere], 0.0)
    if num_beams > 1:
        sequence_scores = reference.generate(num_beams, stops, **controls).sequences_scores.numpy()
        np.testing.assert_allclose(result["sequence_scores"], sequence_scores, atol=ATOL)
