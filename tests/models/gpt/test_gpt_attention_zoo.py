"""GPT language models with the zoo's other causal mechanisms — relative
(Shaw et al. with clipping, and Music Transformer's per-head unclipped form),
local, sparse and additive attention — decode through their key/value caches:
cached logits equal the full forward pass and greedy generation equals
recomputation with full passes. A Music-Transformer-style LM learns to
continue a repeated motif and generates it through `generate`."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models.gpt import GPTBackbone
from attention_zoo_keras.models.gpt import GPTCausalLM
from tests.support.gpt_decoding import full_logits
from tests.support.gpt_decoding import greedy_by_full_passes
from tests.support.gpt_decoding import numpy
from tests.support.gpt_decoding import right_padded_inputs

ATOL = 1e-4
VOCABULARY = 40
MAX_LENGTH = 48
MUSIC_TRANSFORMER = {"max_distance": MAX_LENGTH - 1, "per_head": True, "value_embeddings": False}
MECHANISMS = [
    ("relative", MUSIC_TRANSFORMER),
    ("relative", {"max_distance": 4}),
    ("local", {"block_size": 4}),
    ("sparse", {"pattern": "fixed", "stride": 4, "c": 2}),
    ("additive", {}),
]


def tiny_backbone(attention, attention_options, **overrides):
    config = dict(
        vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=MAX_LENGTH, dropout=0.0, attention_dropout=0.0,
        attention=attention, attention_options=attention_options,
    )
    config.update(overrides)
    return GPTBackbone(**config)


@pytest.fixture(scope="module", params=MECHANISMS, ids=lambda m: m[0] + "-" + "-".join(map(str, m[1].values())))
def lm(request):
    """Weights drawn in numpy (the same on every backend), large enough that
    greedy choices are not near-ties."""
    lm = GPTCausalLM(backbone=tiny_backbone(*request.param))
    rng = np.random.default_rng(0)
    for variable in lm.weights:
        noise = rng.normal(0.0, 0.3, variable.shape)
        variable.assign((1.0 + noise if variable.path.endswith("gamma") else noise).astype("float32"))
    return lm


def test_cached_logits_match_full_forward(lm):
    rng = np.random.default_rng(0)
    batch, length = 2, 11
    token_ids = rng.integers(0, VOCABULARY, size=(batch, length)).astype("int32")
    full = full_logits(lm, token_ids)
    # A prefill of 5 into a cache longer than the sequence, then one token at a time.
    cache = lm.init_cache(batch, 16)
    logits, _, cache = lm.call_with_cache(token_ids[:, :5], cache, 0)
    np.testing.assert_allclose(numpy(logits), full[:, :5], atol=ATOL)
    for index in range(5, length):
        logits, _, cache = lm.call_with_cache(token_ids[:, index : index + 1], cache, index)
        np.testing.assert_allclose(numpy(logits)[:, 0], full[:, index], atol=ATOL)


def test_greedy_generation_equals_recomputation(lm):
    prompts = [[3, 14, 15, 9, 2], [7], [26, 5, 35]]
    result = lm.generate(right_padded_inputs(prompts), max_new_tokens=6, stop_token_ids=None)
    for row, prompt in enumerate(prompts):
        ours = result["token_ids"][row][result["padding_mask"][row].astype(bool)].tolist()
        assert ours == greedy_by_full_passes(lm, prompt, 6), f"prompt {row}"


def motifs(rng, count, period, length):
    """Each row: a random motif of `period` distinct tokens, repeated."""
    rows = np.stack([rng.choice(np.arange(1, VOCABULARY), size=period, replace=False) for _ in range(count)])
    return np.tile(rows, (1, length // period + 1))[:, :length].astype("int32")


@pytest.mark.slow
def test_music_transformer_style_lm_learns_to_continue_a_motif():
    """Continuing a repeated motif means copying the token one period back —
    a fixed relative distance, which relative attention represents directly.
    After training, `generate` continues unseen motifs exactly."""
    keras.utils.set_random_seed(0)
    period, length = 5, 24
    lm = GPTCausalLM(backbone=tiny_backbone("relative", MUSIC_TRANSFORMER, hidden_dim=32, intermediate_dim=64))
    rng = np.random.default_rng(0)
    sequences = motifs(rng, 512, period, length + 1)
    x = {"token_ids": sequences[:, :-1], "padding_mask": np.ones((512, length), "int32")}
    lm.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    lm.fit(x, sequences[:, 1:], batch_size=32, epochs=8, verbose=0)

    unseen = motifs(np.random.default_rng(1), 8, period, 2 * period + 10)
    prompts = unseen[:, : 2 * period]  # the motif twice
    result = lm.generate(
        {"token_ids": prompts, "padding_mask": np.ones_like(prompts)}, max_new_tokens=10, stop_token_ids=None
    )
    continued = (result["token_ids"][:, 2 * period :] == unseen[:, 2 * period :]).mean()
    assert continued >= 0.95, continued
