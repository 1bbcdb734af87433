"""`TransformerSeq2SeqLM` as a task: cached decoding against recomputation
with full forward passes (softmax and the zoo's other self-attention
mechanisms), sampling and the suppressed / forced-end rules, training on raw
text pairs with label smoothing and the paper's schedule, the preset round
trip, and clear errors for bad inputs."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.generation.samplers import get_sampler
from attention_zoo_keras.generation.samplers import sampler_uniforms
from attention_zoo_keras.models.transformer import TransformerBackbone
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.models.transformer import TransformerTokenizer
from tests.support.family_tests import run_preset_test
from tests.support.tiny_checkpoints import SOURCE_CORPUS
from tests.support.tiny_checkpoints import TARGET_CORPUS

VOCABULARY = 40
MAX_SEQUENCE_LENGTH = 32
MAX_LENGTH = 10
START_ID, END_ID = 0, 1
# Three sources of different lengths, as id lists (for models without a
# tokenizer) and as text (for the Marian tokenizer).
SOURCE_IDS = [[5, 6, 7, 8, 9, 10, 11, END_ID], [12, 13, END_ID], [14, 15, 16, 17, END_ID]]
SOURCES = ["The cat.", "Where is the old bridge?", "Attention is all you need."]
MECHANISMS = [
    ("softmax", {}),
    ("relative", {"max_distance": 4}),
    ("relative", {"max_distance": MAX_SEQUENCE_LENGTH - 1, "per_head": True, "value_embeddings": False}),
    ("linear", {}),
    ("local", {"block_size": 4}),
]


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def tiny_backbone(vocabulary_size=VOCABULARY, **overrides):
    config = dict(
        vocabulary_size=vocabulary_size, num_encoder_layers=2, num_decoder_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=MAX_SEQUENCE_LENGTH, dropout=0.0, attention_dropout=0.0,
    )
    return TransformerBackbone(**{**config, **overrides})


def randomize(model, seed=0):
    """Weights drawn in numpy (the same on every backend), large enough that
    greedy choices are not near-ties; biases stay 0, so that outputs depend
    on the inputs more than on constant offsets. Returns the model."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if not variable.path.endswith(("bias", "beta")):
            noise = rng.normal(0.0, 0.3, variable.shape)
            variable.assign((1.0 + noise if variable.path.endswith("gamma") else noise).astype("float32"))
    return model


def right_padded(rows, pad_id=0):
    """`{"encoder_token_ids", "encoder_padding_mask"}` of id lists."""
    width = max(map(len, rows))
    token_ids = np.full((len(rows), width), pad_id, "int32")
    padding_mask = np.zeros((len(rows), width), "int32")
    for row, ids in enumerate(rows):
        token_ids[row, : len(ids)] = ids
        padding_mask[row, : len(ids)] = 1
    return {"encoder_token_ids": token_ids, "encoder_padding_mask": padding_mask}


def rows_of(output):
    """The generated rows of `generate`'s dict output, as id lists."""
    return [ids[mask.astype(bool)].tolist() for ids, mask in zip(output["token_ids"], output["padding_mask"])]


def decode_by_full_passes(mt, sources, start_id, max_length, sampler="greedy", seed=None, stop_ids=(),
                          suppressed=(), force_end=False):
    """Decoding that recomputes the whole forward pass for every token, with
    `generate`'s rules: suppressed ids are never chosen, a row ends after a
    stop token, and with `force_end` the token at the last position is the
    first stop token. A random sampler draws at the uniforms `generate`
    draws from `seed`. Returns one id list per source."""
    sampler = get_sampler(sampler)
    batch = len(sources["encoder_token_ids"])
    uniforms = sampler_uniforms(sampler, batch, max_length, max_length, seed)
    # A fixed-width decoder input: the causal decoder's output at a position
    # does not depend on the (start-token) filler after it.
    token_ids = np.full((batch, max_length), start_id, "int32")
    lengths = np.full(batch, max_length)
    features = {**sources, "decoder_padding_mask": np.ones_like(token_ids)}
    for position in range(1, max_length):
        scores = numpy(mt({**features, "decoder_token_ids": token_ids}))[:, position - 1].astype("float32")
        scores[:, list(suppressed)] = -1e9
        if force_end and position == max_length - 1:
            scores[:, np.arange(scores.shape[1]) != stop_ids[0]] = -1e9
        top_two = np.sort(scores, axis=-1)[:, -2:]
        assert sampler.is_random or (top_two[:, 1] - top_two[:, 0] > 1e-3).all(), "a near-tie decided by rounding"
        token_ids[:, position] = numpy(sampler.choose(scores, uniforms[:, position]))
        stopped = (lengths == max_length) & np.isin(token_ids[:, position], stop_ids)
        lengths[stopped] = position + 1
    return [token_ids[row, :length].tolist() for row, length in enumerate(lengths)]


# --- cached decoding against recomputation ----------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_marian_tokenizer_files):
    files = tiny_marian_tokenizer_files
    return TransformerTokenizer.from_marian(files / "source.spm", files / "target.spm", files / "vocab.json")


def tiny_mt(tokenizer, logits_bias=True, **backbone_overrides):
    """A tiny Marian-like model (SiLU, tensor2tensor sinusoids, a logits
    bias) with the fixture's Marian tokenizer."""
    # generate's default max_length is decoder_sequence_length + 1: MAX_LENGTH.
    preprocessor = TransformerSeq2SeqLMPreprocessor(
        tokenizer, encoder_sequence_length=24, decoder_sequence_length=MAX_LENGTH - 1
    )
    backbone = tiny_backbone(
        tokenizer.vocabulary_size, activation="swish", position_embedding="sinusoidal_concatenated",
        **backbone_overrides,
    )
    return TransformerSeq2SeqLM(backbone, preprocessor=preprocessor, logits_bias=logits_bias)


@pytest.fixture(scope="module")
def mt(tokenizer):
    return randomize(tiny_mt(tokenizer))


def test_generation_equals_recomputation_with_the_marian_rules(mt, tokenizer):
    """Greedy and temperature sampling, `<pad>` suppressed, `</s>` stopping
    rows and forced at `max_length`; strings in, strings out."""
    sources = mt.preprocessor.pack_sources(SOURCES)
    assert len(set(sources["encoder_padding_mask"].sum(axis=1).tolist())) == 3  # different lengths
    rules = dict(stop_ids=[tokenizer.end_token_id], suppressed=[tokenizer.pad_token_id], force_end=True)
    start = mt.preprocessor.decoder_start_token_id
    greedy = decode_by_full_passes(mt, sources, start, MAX_LENGTH, **rules)
    assert rows_of(mt.generate(sources)) == greedy
    sampled = decode_by_full_passes(mt, sources, start, MAX_LENGTH, "temperature", seed=0, **rules)
    assert rows_of(mt.generate(sources, sampler="temperature", seed=0)) == sampled
    assert len({len(row) for row in sampled}) > 1  # a row stopped early
    assert mt.generate(SOURCES) == [tokenizer.decode(row[1:]) for row in greedy]
    assert mt.generate(SOURCES[1]) == tokenizer.decode(greedy[1][1:])


@pytest.fixture(scope="module", params=MECHANISMS, ids=lambda m: "-".join([m[0], *map(str, m[1].values())]))
def zoo_mt(request):
    attention, options = request.param
    return randomize(TransformerSeq2SeqLM(tiny_backbone(attention=attention, attention_options=options)))


def test_generation_equals_recomputation_for_every_mechanism(zoo_mt):
    """Self-attention caches of softmax, relative (clipped, and Music
    Transformer's per-head form), linear (the recurrent state) and local
    attention, with dict inputs and no preprocessor. Greedy decoding of
    random weights soon repeats a token, so temperature sampling checks
    varied histories too."""
    sources = right_padded(SOURCE_IDS)
    arguments = dict(max_length=MAX_LENGTH, decoder_start_token_id=START_ID)
    greedy = decode_by_full_passes(
        zoo_mt, sources, START_ID, MAX_LENGTH, stop_ids=[END_ID], suppressed=[2, 3], force_end=True
    )
    output = zoo_mt.generate(sources, stop_token_ids=[END_ID], suppressed_token_ids=[2, 3], **arguments)
    assert rows_of(output) == greedy
    sampled = decode_by_full_passes(zoo_mt, sources, START_ID, MAX_LENGTH, "temperature", seed=1)
    output = zoo_mt.generate(
        sources, stop_token_ids=None, suppressed_token_ids=None, force_end_token=False, sampler="temperature",
        seed=1, **arguments,
    )
    assert rows_of(output) == sampled
    assert len({token for row in sampled for token in row}) > MAX_LENGTH


# --- sampling, suppressed and forced tokens ---------------------------------


def test_top_k_sampling_is_reproducible_and_draws_among_the_k_best(mt, tokenizer):
    sources = mt.preprocessor.pack_sources(SOURCES)
    first = rows_of(mt.generate(sources, sampler="top_k", k=3, seed=7))
    assert rows_of(mt.generate(sources, sampler="top_k", k=3, seed=7)) == first
    assert rows_of(mt.generate(sources, sampler="top_k", k=3, seed=8)) != first
    # Teacher-forced on the sampled rows, the model ranks every token among
    # its 3 best (with <pad> suppressed), except the </s> forced at max_length.
    width = max(map(len, first))
    decoder_token_ids = np.array([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids in first], "int32")
    scores = numpy(mt({
        **sources, "decoder_token_ids": decoder_token_ids, "decoder_padding_mask": np.ones_like(decoder_token_ids),
    }))
    scores[..., tokenizer.pad_token_id] = -np.inf
    for row, ids in enumerate(first):
        for position, token in enumerate(ids[1:], start=1):
            if position == MAX_LENGTH - 1:
                assert token == tokenizer.end_token_id
            else:
                assert token in np.argsort(scores[row, position - 1])[-3:], (row, position)


def test_suppressed_ids_never_appear(mt, tokenizer):
    sources = mt.preprocessor.pack_sources(SOURCES)
    greedy = rows_of(mt.generate(sources))
    # Suppress <pad> and every token greedy decoding chose (but </s>): it must choose others.
    chosen = {token for row in greedy for token in row[1:]} - {tokenizer.end_token_id}
    suppressed = sorted(chosen | {tokenizer.pad_token_id})
    for options in ({}, {"sampler": "top_k", "k": 5, "seed": 0}, {"num_beams": 3}):
        rows = rows_of(mt.generate(sources, suppressed_token_ids=suppressed, **options))
        generated = {token for row in rows for token in row[1:]}
        assert generated - {tokenizer.end_token_id} and not generated & set(suppressed), options


@pytest.mark.parametrize("options", [{}, {"num_beams": 3}], ids=["greedy", "beam"])
def test_force_end_token_puts_the_end_token_last_at_max_length(mt, tokenizer, options):
    sources = mt.preprocessor.pack_sources(SOURCES)
    end = tokenizer.end_token_id
    forced = rows_of(mt.generate(sources, max_length=5, **options))
    free = rows_of(mt.generate(sources, max_length=5, force_end_token=False, **options))
    assert all(len(row) <= 5 and row[-1] == end for row in forced)
    assert any(len(row) == 5 and row[-1] != end for row in free)
    if not options:  # greedy rows differ in their last token only (beams may rank differently)
        for forced_row, free_row in zip(forced, free):
            if free_row[-1] != end:
                assert forced_row[:-1] == free_row[:-1]


# --- training ----------------------------------------------------------------

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(1e-2),
    # The paper's recipe (§5.3), its warmup shortened to this test's few steps.
    "transformer_schedule": lambda: azk.optimizers.transformer_schedule(hidden_dim=16, warmup_steps=8, scale=0.25),
}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_fit_on_text_pairs_lowers_the_label_smoothed_loss(tokenizer, optimizer):
    keras.utils.set_random_seed(0)
    model = tiny_mt(tokenizer, logits_bias=False, dropout=0.1)
    model.compile(optimizer=OPTIMIZERS[optimizer](), label_smoothing=0.1)
    assert isinstance(model.loss, azk.losses.SparseCategoricalCrossentropyWithLabelSmoothing)
    pairs = (list(SOURCE_CORPUS), list(TARGET_CORPUS))
    before = model.evaluate(pairs, batch_size=5, verbose=0, return_dict=True)["loss"]
    history = model.fit(pairs, batch_size=5, epochs=30, verbose=0)
    after = model.evaluate(pairs, batch_size=5, verbose=0, return_dict=True)["loss"]
    assert after < 0.7 * before, (before, history.history["loss"], after)


def test_label_smoothing_needs_the_default_loss(mt):
    with pytest.raises(ValueError, match="label_smoothing applies to the default loss"):
        mt.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), label_smoothing=0.1)


# --- presets -----------------------------------------------------------------

TARGETS = ["Die Katze.", "Wo ist die alte Brücke?", "Aufmerksamkeit ist alles."]


def test_preset_round_trip_gives_identical_logits_and_generations(tokenizer, tmp_path):
    model = randomize(tiny_mt(tokenizer), seed=3)
    bias = np.random.default_rng(4).normal(0.0, 1.0, model.lm_head.bias.shape).astype("float32")
    model.lm_head.bias.assign(bias)
    features, _, _ = model.preprocessor((SOURCES, TARGETS))

    reloaded = run_preset_test(model, str(tmp_path), features)
    assert reloaded.logits_bias
    np.testing.assert_array_equal(numpy(reloaded.lm_head.bias), bias)
    assert reloaded.preprocessor.get_config() == model.preprocessor.get_config()
    assert reloaded.generate(SOURCES) == model.generate(SOURCES)

    backbone = TransformerBackbone.from_preset(str(tmp_path))
    assert backbone.get_config() == model.backbone.get_config()
    for key, value in backbone(features).items():
        np.testing.assert_array_equal(numpy(value), numpy(model.backbone(features)[key]))


# --- errors ------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare_mt():
    """A model without a preprocessor: dict inputs only."""
    return TransformerSeq2SeqLM(tiny_backbone())


def sources_with(token_ids, padding_mask=None):
    token_ids = np.asarray(token_ids, "int32")
    padding_mask = np.ones_like(token_ids) if padding_mask is None else np.asarray(padding_mask, "int32")
    return {"encoder_token_ids": token_ids, "encoder_padding_mask": padding_mask}


SOURCE_ROWS = np.array([[5, 6, 7, END_ID], [8, 9, END_ID, 0]], "int32")
SOURCE_MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], "int32")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda mt, bare: mt.generate(["The cat.", " "]), r"Source 1 is empty; there is nothing to translate"),
        (lambda mt, bare: mt.generate([]), r"No source texts were given"),
        (lambda mt, bare: bare.generate(sources_with(np.zeros((0, 4))), decoder_start_token_id=START_ID),
         r"generate needs at least one source; got an empty batch"),
        (lambda mt, bare: bare.generate(sources_with(SOURCE_ROWS, [[1, 1, 1, 1], [0, 0, 0, 0]]),
                                        decoder_start_token_id=START_ID),
         r"Source 1 is empty \(its encoder_padding_mask is all 0\)"),
        (lambda mt, bare: bare.generate(sources_with(np.full((1, 40), 5)), decoder_start_token_id=START_ID),
         r"A source has 40 tokens, more than the model's maximum sequence length 32"),
        (lambda mt, bare: mt.generate(SOURCES, max_length=MAX_SEQUENCE_LENGTH + 1),
         r"max_length 33 is longer than the model's max_sequence_length 32"),
        (lambda mt, bare: mt.generate(SOURCES, max_length=1), r"max_length 1 leaves no room for a token"),
        (lambda mt, bare: bare.generate(sources_with(SOURCE_ROWS, SOURCE_MASK[:1]), decoder_start_token_id=START_ID),
         r"encoder_token_ids and encoder_padding_mask must both be \(batch, source_length\); "
         r"got the shapes \(2, 4\) and \(1, 4\)"),
        (lambda mt, bare: bare.generate(sources_with(SOURCE_ROWS, [[1, 1, 1, 1], [0, 1, 1, 1]]),
                                        decoder_start_token_id=START_ID),
         r"Source 1's encoder_padding_mask is not right-padded"),
        (lambda mt, bare: bare.generate(sources_with(SOURCE_ROWS + VOCABULARY - 5, SOURCE_MASK),
                                        decoder_start_token_id=START_ID),
         r"'encoder_token_ids' holds the id \d+, outside the valid range \[0, 40\)"),
        (lambda mt, bare: bare.generate(sources_with(SOURCE_ROWS, SOURCE_MASK), decoder_start_token_id=VOCABULARY),
         r"'decoder_start_token_id' holds the id 40, outside the valid range \[0, 40\)"),
        (lambda mt, bare: bare.generate(sources_with(SOURCE_ROWS, SOURCE_MASK), decoder_start_token_id=START_ID,
                                        suppressed_token_ids=[-1]),
         r"'suppressed_token_ids' holds the id -1, outside the valid range"),
        (lambda mt, bare: bare.generate(sources_with(SOURCE_ROWS, SOURCE_MASK)),
         r"Without a preprocessor, generate needs decoder_start_token_id"),
        (lambda mt, bare: mt.generate(SOURCES, suppressed_token_ids="pad"),
         r"suppressed_token_ids must be 'auto', None or a list of ids; got 'pad'"),
    ],
    ids=[
        "empty-source", "empty-batch", "empty-dict-batch", "all-padding-row", "source-too-long",
        "max-length-too-long", "max-length-too-short", "mismatched-mask-rows", "left-padded", "id-out-of-range",
        "start-out-of-range", "suppressed-out-of-range", "no-start-token", "suppressed-not-a-list",
    ],
)
def test_generate_names_the_problem(mt, bare_mt, call, message):
    with pytest.raises(ValueError, match=message):
        call(mt, bare_mt)


@pytest.mark.parametrize(
    "inputs, model",
    [((SOURCES, TARGETS), "mt"), ("The cat.", "bare_mt"), ([[5, 6, END_ID]], "bare_mt")],
    ids=["source-target-tuple", "text-without-preprocessor", "id-lists"],
)
def test_generate_refuses_inputs_it_cannot_take(request, inputs, model):
    with pytest.raises(TypeError, match=r"generate takes source strings \(with a preprocessor\) or a dict"):
        request.getfixturevalue(model).generate(inputs, decoder_start_token_id=START_ID)


def test_long_text_sources_are_refused_by_generate(mt, tokenizer):
    """A preprocessor that keeps more source tokens than the model has
    positions: generate names the problem instead of failing inside."""
    long_sources = TransformerSeq2SeqLM(
        mt.backbone, preprocessor=TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=64)
    )
    with pytest.raises(ValueError, match=r"A source has \d+ tokens, more than the model's maximum sequence length 32"):
        long_sources.generate(" ".join(SOURCE_CORPUS[:3]), max_length=4)


def test_fit_names_bad_training_data(mt, tokenizer):
    with pytest.raises(ValueError, match=r"different numbers of examples: \[3, 2\]"):
        mt.fit((SOURCES, TARGETS[:2]), epochs=1, verbose=0)
    long_targets = TransformerSeq2SeqLM(
        mt.backbone,
        preprocessor=TransformerSeq2SeqLMPreprocessor(  # every batch 40 wide, whatever its texts
            tokenizer, encoder_sequence_length=24, decoder_sequence_length=40, padding="max_length"
        ),
    )
    with pytest.raises(ValueError, match=r"'decoder_token_ids' has length 40, longer than the model's maximum "
                                         r"sequence length 32"):
        long_targets.fit((SOURCES, TARGETS), epochs=1, verbose=0)
    features, labels, _ = mt.preprocessor((SOURCES, TARGETS))
    with pytest.raises(ValueError, match=r"encoder_token_ids has 3 rows but decoder_token_ids has 2"):
        mt.fit({**features, "decoder_token_ids": features["decoder_token_ids"][:2],
                "decoder_padding_mask": features["decoder_padding_mask"][:2]}, labels, epochs=1, verbose=0)
    features["decoder_token_ids"][0, 1] = tokenizer.vocabulary_size
    with pytest.raises(ValueError, match=rf"'decoder_token_ids' holds the id {tokenizer.vocabulary_size}, outside"):
        mt.fit(features, labels, epochs=1, verbose=0)


def test_raw_validation_pairs_and_seeded_shuffles(tiny_marian_tokenizer_files):
    """`validation_data=(sources, targets)` is raw input holding its own
    labels; `keras.utils.set_random_seed` makes `fit` on raw text repeat."""
    tokenizer = TransformerTokenizer.from_marian(
        tiny_marian_tokenizer_files / "source.spm",
        tiny_marian_tokenizer_files / "target.spm",
        tiny_marian_tokenizer_files / "vocab.json",
    )
    sources = ["The quick brown fox.", "A small frog sat.", "Where is the bridge?", "We train the model."]
    targets = ["Der schnelle Fuchs.", "Ein kleiner Frosch.", "Wo ist die Brücke?", "Wir trainieren."]

    def train():
        keras.utils.set_random_seed(3)
        backbone = TransformerBackbone(
            vocabulary_size=tokenizer.vocabulary_size, num_encoder_layers=1, num_decoder_layers=1, num_heads=2,
            hidden_dim=8, intermediate_dim=16, max_sequence_length=24,
        )
        preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=24, decoder_sequence_length=24)
        model = TransformerSeq2SeqLM(backbone, preprocessor=preprocessor)
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
        history = model.fit((sources, targets), batch_size=2, epochs=2, validation_data=(sources[:2], targets[:2]),
                            verbose=0)
        return history.history

    first, second = train(), train()
    assert "val_loss" in first and len(first["val_loss"]) == 2
    np.testing.assert_allclose(first["loss"], second["loss"], rtol=1e-5)
