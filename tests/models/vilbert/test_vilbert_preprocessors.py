"""ViLBERTPreprocessor (raw texts + detector regions → features, as the
authors' data loaders build them) and ViLBERTPretrainerPreprocessor (the
authors' Conceptual Captions masking and caption swapping); raw input
through a task's `predict`; presets with their preprocessor."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.models.bert import BertPreprocessor
from attention_zoo_keras.models.bert import BertTokenizer
from attention_zoo_keras.models.vilbert import ViLBERTBackbone
from attention_zoo_keras.models.vilbert import ViLBERTImageTextRetriever
from attention_zoo_keras.models.vilbert import ViLBERTPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTPretrainerPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTRetrievalPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTVisualQuestionAnswerer
from attention_zoo_keras.models.vilbert.vilbert_region_inputs import region_inputs


VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
    "what", "colour", "is", "the", "sofa", "a", "red", "car", "dog", "on", "grass", "?",
]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_vocabulary(VOCABULARY)


def raw_images(count, seed=0, feature_dim=6):
    rng = np.random.default_rng(seed)
    regions, boxes, classes = [], [], []
    for image in range(count):
        n = 2 + image % 3
        regions.append(rng.normal(size=(n, feature_dim)).astype("float32"))
        corners = rng.uniform(0, 40, size=(n, 2))
        boxes.append(np.concatenate([corners, corners + rng.uniform(1, 40, size=(n, 2))], 1).astype("float32"))
        classes.append(rng.dirichlet(np.ones(5), size=n).astype("float32"))
    return regions, boxes, classes


def test_features_are_bert_packing_and_the_region_inputs(tokenizer):
    regions, boxes, _ = raw_images(3)
    texts = ["what colour is the sofa?", "a red car", "a dog on the grass"]
    preprocessor = ViLBERTPreprocessor(tokenizer, sequence_length=9, max_regions=6)
    features = preprocessor({"text": texts, "regions": regions, "boxes": boxes, "image_size": (90, 100)})
    text = BertPreprocessor(tokenizer, sequence_length=9)(texts)
    expected_regions = region_inputs(regions, boxes, (90, 100), max_regions=6)
    for name, value in {**text, **expected_regions}.items():
        np.testing.assert_array_equal(features[name], value, err_msg=name)
    assert "task_ids" not in features


def test_task_id_adds_task_ids(tokenizer):
    regions, boxes, _ = raw_images(2)
    preprocessor = ViLBERTPreprocessor(tokenizer, sequence_length=8, max_regions=5, task_id=1)
    features = preprocessor({"text": ["a red car", "a dog"], "regions": regions, "boxes": boxes, "image_size": (90, 100)})
    np.testing.assert_array_equal(features["task_ids"], [[1], [1]])
    assert preprocessor.get_config() == {
        "sequence_length": 8, "max_regions": 5, "task_id": 1, "padding": "buckets", "bucket_lengths": None
    }


def test_missing_keys_and_unpaired_texts(tokenizer):
    regions, boxes, _ = raw_images(2)
    preprocessor = ViLBERTPreprocessor(tokenizer, sequence_length=8, max_regions=5)
    with pytest.raises(ValueError, match="missing 'boxes', 'image_size'"):
        preprocessor({"text": ["a dog"], "regions": regions})
    with pytest.raises(ValueError, match="3 texts but 2 images"):
        preprocessor({"text": ["a", "red", "car"], "regions": regions, "boxes": boxes, "image_size": (90, 100)})


def test_batches_take_a_shared_or_a_per_image_size(tokenizer):
    regions, boxes, _ = raw_images(3)
    preprocessor = ViLBERTPreprocessor(tokenizer, sequence_length=8, max_regions=5)
    shared = {"text": ["a", "red", "car"], "regions": regions, "boxes": boxes, "image_size": (90, 100)}
    batch = preprocessor.examples(shared, np.array([2, 0]))
    assert batch["image_size"] == (90, 100) and len(batch["regions"]) == 2
    np.testing.assert_array_equal(batch["regions"][0], regions[2])
    per_image = {**shared, "image_size": [(90, 100), (80, 120), (100, 100)]}
    assert preprocessor.examples(per_image, np.array([2, 0]))["image_size"] == [(100, 100), (90, 100)]


def tiny_backbone(vocabulary_size, **overrides):
    config = dict(
        vocabulary_size=vocabulary_size, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
        region_feature_dim=6, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=8,
        visual_intermediate_dim=16, co_attention_dim=8, co_attention_num_heads=2,
        co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1], max_sequence_length=12,
    )
    config.update(overrides)
    return ViLBERTBackbone(**config)


def test_answerer_predicts_from_raw_questions_and_regions(tokenizer, tmp_path):
    regions, boxes, _ = raw_images(5)
    raw = {
        "text": ["what colour is the sofa?", "a red car", "a dog on the grass", "what is the dog on?", "a sofa"],
        "regions": regions, "boxes": boxes, "image_size": [(90, 100)] * 5,
    }
    preprocessor = ViLBERTPreprocessor(tokenizer, sequence_length=10, max_regions=6)
    vqa = ViLBERTVisualQuestionAnswerer(tiny_backbone(len(VOCABULARY)), num_answers=7, preprocessor=preprocessor)
    from_raw = vqa.predict(raw, batch_size=2, verbose=0)
    from_features = vqa.predict(preprocessor(raw), verbose=0)
    np.testing.assert_allclose(from_raw, from_features, atol=1e-5)

    vqa.save_to_preset(tmp_path / "vqa")
    loaded = ViLBERTVisualQuestionAnswerer.from_preset(str(tmp_path / "vqa"))
    assert isinstance(loaded.preprocessor, ViLBERTPreprocessor)
    assert loaded.preprocessor.get_config() == preprocessor.get_config()
    np.testing.assert_allclose(loaded.predict(raw, verbose=0), from_raw, atol=1e-5)


def pretraining_batch(count=6, seed=0):
    regions, boxes, classes = raw_images(count, seed)
    words = ["red", "car", "dog", "sofa", "grass"]
    texts = [" ".join(words[(i // 5**k) % 5] for k in range(3)) for i in range(count)]  # all different
    return {"text": texts, "regions": regions, "boxes": boxes, "image_size": (90, 100), "region_classes": classes}


def test_swapped_captions_are_labelled(tokenizer):
    raw = pretraining_batch(count=40)
    preprocessor = ViLBERTPretrainerPreprocessor(
        tokenizer, sequence_length=12, max_regions=6, mask_token_rate=0.0, random_token_rate=0.0, seed=3
    )
    x, y, w = preprocessor(raw)
    originals = BertPreprocessor(tokenizer, sequence_length=12)(raw["text"])["token_ids"]
    labels = y["alignment_logits"]
    kept = (x["token_ids"] == originals).all(-1)
    np.testing.assert_array_equal(kept, labels == 0)  # (the selected words are left as they are)
    assert 10 < labels.sum() < 30  # about half, at mismatch_rate 0.5
    np.testing.assert_array_equal(w["alignment_logits"], np.ones(40))


def test_masked_regions_and_their_targets(tokenizer):
    raw = pretraining_batch(count=30)
    preprocessor = ViLBERTPretrainerPreprocessor(
        tokenizer, sequence_length=12, max_regions=6, region_mask_rate=0.5, region_zero_rate=1.0, mismatch_rate=0.0,
        seed=1,
    )
    x, y, w = preprocessor(raw)
    selected = w["region_logits"].astype(bool)
    assert not selected[:, 0].any()  # never the global region
    for row, (features, classes) in enumerate(zip(raw["regions"], raw["region_classes"])):
        n = len(features)
        assert not selected[row, 1 + n :].any()  # never padding
        chosen = selected[row, 1 : 1 + n]
        expected = np.where(chosen[:, None], 0.0, features)
        np.testing.assert_allclose(x["region_features"][row, 1 : 1 + n], expected, err_msg=str(row))
        np.testing.assert_allclose(x["region_features"][row, 0], expected.mean(0), atol=1e-6)
        np.testing.assert_allclose(y["region_logits"][row, 1 : 1 + n], classes)
        assert not y["region_logits"][row, 0].any()
    share = selected.sum() / sum(len(f) for f in raw["regions"])
    assert 0.3 < share < 0.7, share


def test_masked_words(tokenizer):
    raw = pretraining_batch(count=8)
    preprocessor = ViLBERTPretrainerPreprocessor(
        tokenizer, sequence_length=12, max_regions=6, mask_selection_length=3, mask_token_rate=1.0,
        random_token_rate=0.0, mismatch_rate=0.0, seed=0,
    )
    x, y, w = preprocessor(raw)
    originals = BertPreprocessor(tokenizer, sequence_length=12)(raw["text"])["token_ids"]
    for row in range(8):
        positions = x["mask_positions"][row][w["token_logits"][row] > 0]
        assert len(positions) >= 1
        np.testing.assert_array_equal(x["token_ids"][row, positions], tokenizer.mask_token_id)
        np.testing.assert_array_equal(y["token_logits"][row][: len(positions)], originals[row, positions])


def test_the_same_seed_gives_the_same_batch(tokenizer):
    raw = pretraining_batch()
    first = ViLBERTPretrainerPreprocessor(tokenizer, sequence_length=12, max_regions=6, seed=7)(raw)
    second = ViLBERTPretrainerPreprocessor(tokenizer, sequence_length=12, max_regions=6, seed=7)(raw)
    for part_a, part_b in zip(first, second):
        for name in part_a:
            np.testing.assert_array_equal(part_a[name], part_b[name], err_msg=name)


def test_pretraining_input_errors(tokenizer):
    raw = pretraining_batch(count=3)
    preprocessor = ViLBERTPretrainerPreprocessor(tokenizer, sequence_length=12, max_regions=6)
    with pytest.raises(ValueError, match="missing 'region_classes'"):
        preprocessor({k: v for k, v in raw.items() if k != "region_classes"})
    uneven = {**raw, "region_classes": [raw["region_classes"][0][:, :3]] + raw["region_classes"][1:]}
    with pytest.raises(ValueError, match="same num_classes"):
        preprocessor(uneven)
    short = {**raw, "region_classes": [raw["region_classes"][0][:1]] + raw["region_classes"][1:]}
    with pytest.raises(ValueError, match="Image 0 has 2 regions but 1 rows"):
        preprocessor(short)
    with pytest.raises(ValueError, match="region_mask_rate"):
        ViLBERTPretrainerPreprocessor(tokenizer, region_mask_rate=1.5)


def test_task_tokens_are_inserted_after_cls_without_position():
    """A task token is the task's embedding, inserted after [CLS] with no
    position or segment embedding, always attended (the authors'
    `BertEmbeddings` with `task_specific_tokens`). The same computation in a
    backbone without task tokens: an extra token id whose embedding is the
    task embedding minus segment 0's, at a position whose embedding is
    zero, the later positions shifted by one."""
    keras.utils.set_random_seed(0)
    with_task = tiny_backbone(10, max_sequence_length=8, num_task_tokens=3, dropout=0.0)
    plain = tiny_backbone(11, max_sequence_length=9, dropout=0.0)
    rng = np.random.default_rng(0)
    for variable in with_task.weights:
        variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))
    ours = variables_by_key(with_task)
    task = 2
    for key, variable in variables_by_key(plain).items():
        value = keras.ops.convert_to_numpy(ours[key])
        if key.startswith("token_embedding"):
            segment = keras.ops.convert_to_numpy(with_task.get_layer("segment_embedding").embeddings)[0]
            task_vector = keras.ops.convert_to_numpy(with_task.get_layer("task_embedding").embeddings)[task]
            value = np.concatenate([value, (task_vector - segment)[None]])
        elif key.startswith("position_embedding"):
            value = np.concatenate([value[:1], np.zeros_like(value[:1]), value[1:]])
        variable.assign(value)

    ids = np.array([[2, 5, 6, 7, 3, 0], [2, 8, 3, 0, 0, 0]], "int32")
    mask = (ids > 0).astype("int32")
    segments = np.array([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]], "int32")
    regions = {
        "region_features": rng.normal(size=(2, 3, 6)).astype("float32"),
        "region_boxes": rng.uniform(size=(2, 3, 5)).astype("float32"),
        "region_mask": np.array([[1, 1, 1], [1, 1, 0]], "int32"),
    }
    got = with_task({"token_ids": ids, "segment_ids": segments, "padding_mask": mask, **regions,
                     "task_ids": np.full((2, 1), task, "int32")})

    def insert(values, new):
        return np.concatenate([values[:, :1], np.full((2, 1), new, "int32"), values[:, 1:]], axis=1)

    expected = plain({"token_ids": insert(ids, 10), "segment_ids": insert(segments, 0),
                      "padding_mask": insert(mask, 1), **regions})
    assert tuple(got["sequence_output"].shape) == (2, 7, 8)
    for name in expected:
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(got[name]), keras.ops.convert_to_numpy(expected[name]), atol=1e-5, err_msg=name
        )
    with pytest.raises(ValueError, match="task_ids"):
        with_task({"token_ids": ids, "segment_ids": segments, "padding_mask": mask, **regions,
                   "task_ids": np.full((2, 1), 3, "int32")})


def test_bad_regions_given_to_a_task_are_named(tokenizer):
    regions, boxes, _ = raw_images(2)
    preprocessor = ViLBERTPreprocessor(tokenizer, sequence_length=10, max_regions=4)
    vqa = ViLBERTVisualQuestionAnswerer(tiny_backbone(len(VOCABULARY)), num_answers=3, preprocessor=preprocessor)
    raw = {"text": ["a red car", "a dog"], "regions": regions, "boxes": boxes, "image_size": (90, 100)}
    outside = [boxes[0].copy(), boxes[1]]
    outside[0][1, 2] = 140.0  # x2 beyond the 100-pixel-wide image
    with pytest.raises(ValueError, match="box 1 of image 0.*is not inside its image"):
        vqa.predict({**raw, "boxes": outside}, verbose=0)
    crowded = {**raw, "regions": [np.zeros((4, 6), "float32")] * 2, "boxes": [np.tile([0, 0, 5, 5], (4, 1))] * 2}
    with pytest.raises(ValueError, match="max_regions"):
        vqa.predict(crowded, verbose=0)
    wide = {**raw, "regions": [np.zeros((2, 7), "float32")] * 2, "boxes": [np.tile([0, 0, 5, 5], (2, 1))] * 2}
    with pytest.raises(ValueError, match="region_features"):
        vqa.predict(wide, verbose=0)


def test_retrieval_queries_with_candidate_images_or_captions(tokenizer):
    regions, boxes, _ = raw_images(4)
    flat = ViLBERTPreprocessor(tokenizer, sequence_length=8, max_regions=5)
    preprocessor = ViLBERTRetrievalPreprocessor(tokenizer, sequence_length=8, max_regions=5)
    # one caption against two images; one image against two captions
    x = preprocessor({
        "text": ["a red car", ["a dog", "the sofa"]],
        "regions": [regions[:2], regions[2]],
        "boxes": [boxes[:2], boxes[2]],
        "image_size": [[(90, 100), (80, 120)], (70, 100)],
    })
    expected = flat({
        "text": ["a red car", "a red car", "a dog", "the sofa"],
        "regions": [regions[0], regions[1], regions[2], regions[2]],
        "boxes": [boxes[0], boxes[1], boxes[2], boxes[2]],
        "image_size": [(90, 100), (80, 120), (70, 100), (70, 100)],
    })
    for name, value in expected.items():
        np.testing.assert_array_equal(x[name], value.reshape(2, 2, *value.shape[1:]), err_msg=name)
    with pytest.raises(ValueError, match="same number of candidates"):
        preprocessor({"text": ["a red car", "a dog"], "regions": [regions[:2], regions[:3]],
                      "boxes": [boxes[:2], boxes[:3]], "image_size": (90, 100)})
    with pytest.raises(ValueError, match="Example 0 has different numbers of candidates"):
        preprocessor({"text": [["a", "dog", "car"]], "regions": [regions[:2]], "boxes": [boxes[:2]],
                      "image_size": (90, 100)})


def test_retriever_ranks_candidates_from_raw_input(tokenizer):
    regions, boxes, _ = raw_images(3)
    preprocessor = ViLBERTRetrievalPreprocessor(tokenizer, sequence_length=8, max_regions=5)
    retriever = ViLBERTImageTextRetriever(tiny_backbone(len(VOCABULARY)), preprocessor=preprocessor)
    raw = {"text": ["a red car", "a dog"], "regions": [regions, regions[::-1]], "boxes": [boxes, boxes[::-1]],
           "image_size": (90, 100)}
    scores = retriever.predict(raw, batch_size=1, verbose=0)
    assert scores.shape == (2, 3)
    np.testing.assert_allclose(scores, retriever.predict(preprocessor(raw), verbose=0), atol=1e-5)
