"""The Reformer's encoder tasks: `ReformerMaskedLM` and `ReformerTextClassifier`
against random-weight tiny `transformers` `ReformerForMaskedLM` and
`ReformerForSequenceClassification` checkpoints (1e-4 absolute, fp32),
their preprocessors, training, and preset round trips."""

import logging

import keras
import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras.attention.lsh import lsh_rotations_shape
from attention_zoo_keras.models.reformer import ReformerBackbone
from attention_zoo_keras.models.reformer import ReformerByteTokenizer
from attention_zoo_keras.models.reformer import ReformerMaskedLM
from attention_zoo_keras.models.reformer import ReformerMaskedLMPreprocessor
from attention_zoo_keras.models.reformer import ReformerPreprocessor
from attention_zoo_keras.models.reformer import ReformerTextClassifier
from attention_zoo_keras.models.reformer import ReformerTokenizer
from attention_zoo_keras.tokenizers.sentencepiece_model import BPE
from attention_zoo_keras.tokenizers.sentencepiece_model import CONTROL
from attention_zoo_keras.tokenizers.sentencepiece_model import UNKNOWN
from attention_zoo_keras.tokenizers.sentencepiece_model import SentencePiece
from attention_zoo_keras.tokenizers.sentencepiece_model import SentencePieceModel
from attention_zoo_keras.tokenizers.sentencepiece_model import bpe_tokenizer
from tests.support.tiny_checkpoints import perturbed

ATOL = 1e-4
HASH_SEED = 7
NUM_CLASSES = 3
# 258 ids: the converter then attaches the enwik8 byte tokenizer, so the
# tasks load from the checkpoint directories with their preprocessors.
TINY_REFORMER = dict(
    vocab_size=258,
    hidden_size=8,
    num_attention_heads=2,
    attention_head_size=4,
    feed_forward_size=16,
    attn_layers=["local", "lsh", "local", "lsh"],
    is_decoder=False,
    num_hashes=2,
    num_buckets=[2, 2],
    lsh_attn_chunk_length=4,
    lsh_num_chunks_before=1,
    lsh_num_chunks_after=1,
    local_attn_chunk_length=8,
    local_num_chunks_before=1,
    local_num_chunks_after=1,
    axial_pos_embds=True,
    axial_pos_shape=[4, 8],
    axial_pos_embds_dim=[4, 4],
    max_position_embeddings=32,
    hash_seed=HASH_SEED,
    hidden_dropout_prob=0.0,
    lsh_attention_probs_dropout_prob=0.0,
    local_attention_probs_dropout_prob=0.0,
    pad_token_id=0,
    eos_token_id=1,
    # Wider than the default 0.02, so attention is far from uniform and
    # every token matters (see test_parity_is_sensitive_to_...).
    initializer_range=0.2,
)
# Lengths: 3 fits in the shortest chunk (no padding, whole-sequence attention);
# 6 and 20 are padded to 8 and 24 (multiples of the chunk lengths 4 and 8);
# 16 needs none.
LENGTHS = [3, 6, 16, 20]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """`{"masked_lm": (dir, model), "classifier": (dir, model)}`: perturbed
    random-weight `transformers` models, saved with `save_pretrained`."""
    root = tmp_path_factory.mktemp("tiny_reformer")
    torch.manual_seed(0)
    models = {
        "masked_lm": transformers.ReformerForMaskedLM(transformers.ReformerConfig(**TINY_REFORMER)),
        "classifier": transformers.ReformerForSequenceClassification(
            transformers.ReformerConfig(**TINY_REFORMER, num_labels=NUM_CLASSES)
        ),
    }
    perturbed(models["masked_lm"], 21)
    with torch.no_grad():
        models["masked_lm"].lm_head.bias.zero_()  # transformers 5.x does not add it (see reformer_causal_lm)
    perturbed(models["classifier"], 22)
    paths = {}
    for name, model in models.items():
        path = root / name
        model.save_pretrained(path)
        paths[name] = (str(path), model)
    return paths


def share_rotations(backbone):
    """Gives every LSH layer of `backbone` the rotations transformers draws
    with `hash_seed` (it reseeds torch with it in every LSH layer)."""
    torch.manual_seed(HASH_SEED)
    shape = lsh_rotations_shape(
        TINY_REFORMER["num_attention_heads"], TINY_REFORMER["attention_head_size"],
        TINY_REFORMER["num_hashes"], TINY_REFORMER["num_buckets"],
    )
    assert backbone.lsh_rotations_shape == shape
    backbone.set_lsh_rotations(torch.randn(shape).numpy())


def load_classifier_head(classifier, reference):
    """Copies `classifier.dense` and `classifier.out_proj` of a
    `ReformerForSequenceClassification` into the head (until the converter
    maps them)."""
    state = {key: value.detach().numpy() for key, value in reference.state_dict().items()}
    for ours, theirs in (("classifier_dense", "classifier.dense"), ("classifier_out_proj", "classifier.out_proj")):
        layer = classifier.get_layer(ours)
        layer.kernel.assign(state[f"{theirs}.weight"].T)
        layer.bias.assign(state[f"{theirs}.bias"])


def random_batch(length, masked, seed=0):
    """Token ids `(2, length)` (no special ids) and a padding mask: all
    ones, or (`masked`) the second row's last third padding."""
    rng = np.random.default_rng(seed + length)
    token_ids = rng.integers(2, TINY_REFORMER["vocab_size"], size=(2, length)).astype("int32")
    padding_mask = np.ones((2, length), dtype="int32")
    if masked:
        padding_mask[1, length - max(1, length // 3) :] = 0
    return token_ids, padding_mask


def reference_logits(model, token_ids, padding_mask, masked):
    with torch.no_grad():
        output = model(
            input_ids=torch.tensor(token_ids, dtype=torch.long),
            attention_mask=torch.tensor(padding_mask, dtype=torch.long) if masked else None,
        )
    return output.logits.numpy()


def logits_of(task, token_ids, padding_mask):
    # A direct call, not `predict`: TensorFlow's predict function relaxes the
    # length to None once it has seen two lengths, and the Reformer needs it static.
    return keras.ops.convert_to_numpy(task({"token_ids": token_ids, "padding_mask": padding_mask}, training=False))


@pytest.fixture(scope="module")
def masked_lm(checkpoints):
    path, _ = checkpoints["masked_lm"]
    task = ReformerMaskedLM.from_preset(path)
    share_rotations(task.backbone)
    return task


@pytest.fixture(scope="module")
def classifier(checkpoints):
    path, reference = checkpoints["classifier"]
    task = ReformerTextClassifier.from_preset(path, num_classes=NUM_CLASSES)
    load_classifier_head(task, reference)
    share_rotations(task.backbone)
    return task


# --- parity -------------------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_mask"])
@pytest.mark.parametrize("length", LENGTHS)
def test_masked_lm_logits_match_transformers(checkpoints, masked_lm, length, masked):
    _, reference = checkpoints["masked_lm"]
    token_ids, padding_mask = random_batch(length, masked)
    expected = reference_logits(reference, token_ids, padding_mask, masked)
    logits = logits_of(masked_lm, token_ids, padding_mask)
    assert logits.shape == (2, length, TINY_REFORMER["vocab_size"])
    real = padding_mask.astype(bool)
    np.testing.assert_allclose(logits[real], expected[real], atol=ATOL)


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_mask"])
@pytest.mark.parametrize("length", LENGTHS)
def test_classifier_logits_match_transformers(checkpoints, classifier, length, masked):
    _, reference = checkpoints["classifier"]
    token_ids, padding_mask = random_batch(length, masked, seed=100)
    expected = reference_logits(reference, token_ids, padding_mask, masked)
    logits = logits_of(classifier, token_ids, padding_mask)
    assert logits.shape == (2, NUM_CLASSES)
    np.testing.assert_allclose(logits, expected, atol=ATOL)


def test_parity_is_sensitive_to_the_hashing_and_the_look_ahead(checkpoints, masked_lm):
    """The same weights under other rotations (another `hash_seed`), or
    without the chunks after each chunk, give logits far outside the
    tolerance: the parity above checks LSH hashing and the look-ahead. (32
    positions: four local chunks, so the chunk after is not the one before.)"""
    _, reference = checkpoints["masked_lm"]
    token_ids, padding_mask = random_batch(32, masked=False)
    logits = logits_of(masked_lm, token_ids, padding_mask)
    np.testing.assert_allclose(logits, reference_logits(reference, token_ids, padding_mask, False), atol=ATOL)
    for change in ({"hash_seed": HASH_SEED + 1}, {"lsh_num_chunks_after": 0, "local_num_chunks_after": 0}):
        variant = transformers.ReformerForMaskedLM(transformers.ReformerConfig(**{**TINY_REFORMER, **change}))
        variant.load_state_dict(reference.state_dict())
        expected = reference_logits(variant.eval(), token_ids, padding_mask, False)
        assert np.abs(logits - expected).max() > 100 * ATOL, change


def test_masked_lm_head_loads_from_the_checkpoint(checkpoints, masked_lm):
    _, reference = checkpoints["masked_lm"]
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(masked_lm.lm_head.kernel),
        reference.lm_head.decoder.weight.detach().numpy().T,
    )
    assert isinstance(masked_lm.preprocessor, ReformerMaskedLMPreprocessor)
    assert isinstance(masked_lm.preprocessor.tokenizer, ReformerByteTokenizer)


def test_backbone_of_the_masked_lm_checkpoint_is_bidirectional(checkpoints):
    path, reference = checkpoints["masked_lm"]
    backbone = ReformerBackbone.from_preset(path)
    assert not backbone.is_causal
    options = backbone.attention_options
    assert (options["lsh"]["num_chunks_after"], options["local"]["num_memory_blocks_after"]) == (1, 1)
    token_ids, padding_mask = random_batch(20, masked=True)
    share_rotations(backbone)
    with torch.no_grad():
        expected = reference.reformer(
            input_ids=torch.tensor(token_ids, dtype=torch.long), attention_mask=torch.tensor(padding_mask)
        ).last_hidden_state.numpy()
    output = backbone({"token_ids": token_ids, "padding_mask": padding_mask}, training=False)["sequence_output"]
    output = keras.ops.convert_to_numpy(output)
    real = padding_mask.astype(bool)
    np.testing.assert_allclose(output[real], expected[real], atol=ATOL)


# --- the tasks' checks -------------------------------------------------------


def tiny_backbone(is_causal=False, **overrides):
    """A small bidirectional Reformer over bytes, 16 positions. Its axial
    positions start as small as its token embeddings (not the Reformer's
    N(0, 1), which drowns them and stalls training this small)."""
    arguments = dict(
        vocabulary_size=258, hidden_dim=16, num_heads=2, head_dim=8, intermediate_dim=32,
        attention=["local", "lsh"], is_causal=is_causal,
        attention_options={
            "lsh": {
                "num_hashes": 1, "num_buckets": [2, 2], "chunk_length": 4, "num_chunks_after": 0 if is_causal else 1,
                "seed": 0,
            },
            "local": {"block_size": 8, "num_memory_blocks_after": 0 if is_causal else 1},
        },
        axial_pos_shape=(4, 4), axial_pos_embds_dim=(8, 8), dropout=0.0, attention_dropout={"local": 0.0},
        initializer_range=0.1, axial_norm_std=0.02, seed=0,
    )
    arguments.update(overrides)
    return ReformerBackbone(**arguments)


def test_masked_lm_rejects_a_causal_backbone():
    with pytest.raises(ValueError, match="bidirectional backbone"):
        ReformerMaskedLM(tiny_backbone(is_causal=True))


def test_classifier_warns_on_a_causal_backbone(caplog):
    with caplog.at_level(logging.WARNING):
        ReformerTextClassifier(tiny_backbone(is_causal=True), num_classes=2)
    assert "causal backbone" in caplog.text


@pytest.mark.parametrize("num_classes", [0, 2.0, True, None])
def test_classifier_rejects_bad_num_classes(num_classes):
    with pytest.raises(ValueError, match="num_classes"):
        ReformerTextClassifier(tiny_backbone(), num_classes=num_classes)


def test_classifier_dropout_defaults_to_the_backbones():
    assert ReformerTextClassifier(tiny_backbone(dropout=0.2), num_classes=2).dropout == 0.2
    classifier = ReformerTextClassifier(tiny_backbone(dropout=0.2), num_classes=2, dropout=0.0)
    assert classifier.dropout == 0.0
    assert classifier.get_layer("classifier_dropout").rate == 0.0


# --- preprocessors -----------------------------------------------------------


def tiny_sentencepiece_tokenizer():
    """Pieces `<unk>` 0, `<s>` 1, `</s>` 2, `▁` 3, then the letters a–h (4–11), no merges."""
    pieces = [SentencePiece("<unk>", 0.0, UNKNOWN)]
    pieces += [SentencePiece(token, 0.0, CONTROL) for token in ("<s>", "</s>")]
    pieces += [SentencePiece("▁", -1.0)] + [SentencePiece(c, -2.0 - i) for i, c in enumerate("abcdefgh")]
    return ReformerTokenizer(bpe_tokenizer(SentencePieceModel(model_type=BPE, pieces=tuple(pieces))))


def test_preprocessor_packs_pads_and_passes_labels_through():
    preprocessor = ReformerPreprocessor(ReformerByteTokenizer(), sequence_length=4)
    x, y, w = preprocessor(["ab", "abcdef"], np.array([1, 0]), np.array([0.5, 2.0]))
    # bytes + 2; <EOS> 1 kept when truncating; <pad> 0.
    assert x["token_ids"].tolist() == [[99, 100, 1, 0], [99, 100, 101, 1]]
    assert x["padding_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert y.tolist() == [1, 0] and w.tolist() == [0.5, 2.0]
    assert set(preprocessor("ab")) == {"token_ids", "padding_mask"}

    # SentencePiece: "ab" is "▁" 3, "a" 4, "b" 5; </s> 2 starts, ends and pads (there is no padding token).
    sentencepiece = ReformerPreprocessor(tiny_sentencepiece_tokenizer(), sequence_length=7, add_start_token=True)
    x = sentencepiece(["ab"])
    assert x["token_ids"].tolist() == [[2, 3, 4, 5, 2, 2, 2]]
    assert x["padding_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0]]


def test_masked_lm_preprocessor_masks_only_real_non_special_tokens():
    tokenizer = ReformerByteTokenizer()
    preprocessor = ReformerMaskedLMPreprocessor(
        tokenizer, sequence_length=32, mask_selection_rate=0.5, mask_token_rate=1.0, random_token_rate=0.0, seed=1
    )
    texts = ["abcdefghij", "klmnopqrstuvwxyz", "q"]
    packed = ReformerPreprocessor(tokenizer, sequence_length=32)(texts)
    x, labels, weights = preprocessor(texts)
    np.testing.assert_array_equal(labels, packed["token_ids"])  # the originals, everywhere
    np.testing.assert_array_equal(x["padding_mask"], packed["padding_mask"])
    selected = weights == 1
    assert set(np.unique(weights)) <= {0.0, 1.0}
    assert preprocessor.mask_token_id == tokenizer.pad_token_id == 0
    np.testing.assert_array_equal(x["token_ids"][selected], 0)
    np.testing.assert_array_equal(x["token_ids"][~selected], packed["token_ids"][~selected])
    special = np.isin(packed["token_ids"], tokenizer.special_token_ids)
    assert not (selected & special).any() and not (selected & (packed["padding_mask"] == 0)).any()
    # round(n · rate) of each text's n real non-special tokens, at least one.
    assert selected.sum(axis=1).tolist() == [5, 8, 1]


def test_masked_lm_preprocessor_random_replacement_and_seed():
    tokenizer = ReformerByteTokenizer()
    texts = ["the quick brown fox jumps over the lazy dog " * 2]
    arguments = dict(sequence_length=96, mask_selection_rate=1.0, mask_token_rate=0.0, random_token_rate=1.0)
    x, labels, weights = ReformerMaskedLMPreprocessor(tokenizer, seed=3, **arguments)(texts)
    selected = weights == 1
    replaced = x["token_ids"][selected]
    assert not np.isin(replaced, tokenizer.special_token_ids).any()
    assert (replaced != labels[selected]).mean() > 0.9  # random ids from 256, rarely the original
    again, _, _ = ReformerMaskedLMPreprocessor(tokenizer, seed=3, **arguments)(texts)
    np.testing.assert_array_equal(again["token_ids"], x["token_ids"])
    other, _, _ = ReformerMaskedLMPreprocessor(tokenizer, seed=4, **arguments)(texts)
    assert (other["token_ids"] != x["token_ids"]).any()

    # mask_token_rate 0 and random_token_rate 0: selected, predicted, unchanged.
    keep = ReformerMaskedLMPreprocessor(
        tokenizer, sequence_length=16, mask_token_rate=0.0, random_token_rate=0.0, seed=0
    )
    x, labels, weights = keep(["abcdefgh"], sample_weight=np.array([3.0]))
    np.testing.assert_array_equal(x["token_ids"], labels)
    assert set(np.unique(weights)) == {0.0, 3.0}


def test_masked_lm_preprocessor_sentencepiece_masks_with_unk():
    tokenizer = tiny_sentencepiece_tokenizer()
    preprocessor = ReformerMaskedLMPreprocessor(
        tokenizer, sequence_length=12, mask_selection_rate=1.0, mask_token_rate=1.0, random_token_rate=0.0, seed=0
    )
    assert preprocessor.mask_token_id == tokenizer.unknown_token_id
    x, labels, weights = preprocessor(["abc defg"])
    selected = weights == 1
    assert selected.sum() == 9  # every real non-special token, "▁abc▁defg"; not </s> nor the padding
    np.testing.assert_array_equal(x["token_ids"][selected], tokenizer.unknown_token_id)
    assert ReformerMaskedLMPreprocessor(tokenizer, mask_token_id=5).mask_token_id == 5


def test_masked_lm_preprocessor_errors_and_config():
    tokenizer = ReformerByteTokenizer()
    with pytest.raises(ValueError, match="takes no labels"):
        ReformerMaskedLMPreprocessor(tokenizer, sequence_length=8)(["ab"], np.array([1]))
    with pytest.raises(ValueError, match="at most 1"):
        ReformerMaskedLMPreprocessor(tokenizer, mask_token_rate=0.8, random_token_rate=0.3)
    with pytest.raises(ValueError, match="mask_selection_rate"):
        ReformerMaskedLMPreprocessor(tokenizer, mask_selection_rate=0.0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ReformerMaskedLMPreprocessor(tokenizer, mask_token_id=258)
    preprocessor = ReformerMaskedLMPreprocessor(tokenizer, sequence_length=8, mask_selection_rate=0.3, seed=5)
    config = preprocessor.get_config()
    assert config["mask_token_id"] is None and config["seed"] == 5 and config["sequence_length"] == 8
    rebuilt = ReformerMaskedLMPreprocessor(tokenizer, **config)
    texts = ["abcdef", "xyz"]
    (x, _, weights), (x_rebuilt, _, weights_rebuilt) = preprocessor(texts), rebuilt(texts)
    np.testing.assert_array_equal(x_rebuilt["token_ids"], x["token_ids"])
    np.testing.assert_array_equal(weights_rebuilt, weights)


# --- training ----------------------------------------------------------------


def contains_x_data(count, seed):
    """Texts of 4–13 letters from "abcde"; label 1 iff an "x" is in them."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(count):
        letters = list(rng.choice(list("abcde"), size=rng.integers(4, 14)))
        label = int(rng.integers(2))
        if label:
            letters[int(rng.integers(len(letters)))] = "x"
        texts.append("".join(letters))
        labels.append(label)
    return texts, np.array(labels)


@pytest.mark.slow
def test_classifier_fit_learns_whether_a_text_contains_x():
    keras.utils.set_random_seed(0)
    classifier = ReformerTextClassifier(
        tiny_backbone(), num_classes=2, preprocessor=ReformerPreprocessor(ReformerByteTokenizer(), sequence_length=16)
    )
    classifier.compile(optimizer=keras.optimizers.Adam(3e-3))
    texts, labels = contains_x_data(256, seed=0)
    classifier.fit(texts, labels, batch_size=32, epochs=8, verbose=0)
    test_texts, test_labels = contains_x_data(128, seed=1)
    accuracy = (classifier.predict(test_texts, verbose=0).argmax(-1) == test_labels).mean()
    assert accuracy > 0.85, accuracy


@pytest.mark.slow
def test_masked_lm_fit_lowers_the_loss():
    keras.utils.set_random_seed(0)
    preprocessor = ReformerMaskedLMPreprocessor(ReformerByteTokenizer(), sequence_length=16, seed=0)
    mlm = ReformerMaskedLM(tiny_backbone(), preprocessor=preprocessor)
    mlm.compile(optimizer=keras.optimizers.Adam(3e-3))
    # Runs of one letter: a masked letter is its neighbours'.
    rng = np.random.default_rng(0)
    texts = [letter * int(rng.integers(6, 15)) for letter in rng.choice(list("abcdefgh"), size=256)]
    history = mlm.fit(texts, batch_size=32, epochs=6, verbose=0).history
    assert history["loss"][-1] < 0.3 * history["loss"][0], history["loss"]
    # Without the context a masked letter is a guess among 8 (or the <pad> it became).
    assert history["accuracy"][-1] > 0.9, history["accuracy"]


@pytest.mark.parametrize("task", ["masked_lm", "classifier"])
def test_training_on_a_length_that_needs_padding_raises(task):
    tokenizer = ReformerByteTokenizer()
    if task == "masked_lm":
        preprocessor = ReformerMaskedLMPreprocessor(tokenizer, sequence_length=12)
        model = ReformerMaskedLM(tiny_backbone(), preprocessor=preprocessor)
        arguments = {}
    else:
        model = ReformerTextClassifier(
            tiny_backbone(), num_classes=2, preprocessor=ReformerPreprocessor(tokenizer, sequence_length=12)
        )
        arguments = {"y": np.array([0, 1])}
    with pytest.raises(ValueError, match="must be a multiple of the chunk lengths' least common multiple 8"):
        model.fit(["abcdefgh", "abc"], epochs=1, verbose=0, **arguments)


# --- presets -----------------------------------------------------------------


@pytest.mark.parametrize("task", ["masked_lm", "classifier"])
def test_save_to_preset_round_trip(task, tmp_path):
    tokenizer = ReformerByteTokenizer()
    if task == "masked_lm":
        preprocessor = ReformerMaskedLMPreprocessor(tokenizer, sequence_length=16, mask_selection_rate=0.25, seed=3)
        model = ReformerMaskedLM(tiny_backbone(), preprocessor=preprocessor)
    else:
        preprocessor = ReformerPreprocessor(tokenizer, sequence_length=16)
        model = ReformerTextClassifier(tiny_backbone(dropout=0.1), num_classes=4, preprocessor=preprocessor)
    for variable in model.weights:  # non-trivial norms and biases
        variable.assign(variable + 0.05 * np.random.default_rng(len(variable.path)).standard_normal(variable.shape))
    token_ids, padding_mask = random_batch(12, masked=True)
    expected = logits_of(model, token_ids, padding_mask)
    model.save_to_preset(tmp_path / "preset")
    loaded = type(model).from_preset(str(tmp_path / "preset"))
    np.testing.assert_array_equal(logits_of(loaded, token_ids, padding_mask), expected)
    assert type(loaded.preprocessor) is type(preprocessor)
    assert loaded.preprocessor.get_config() == preprocessor.get_config()
    if task == "classifier":
        assert (loaded.num_classes, loaded.dropout) == (4, 0.1)
