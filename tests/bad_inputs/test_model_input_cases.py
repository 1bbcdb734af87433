"""Bad inputs to models (ids, masks, segment ids, labels, feature names, no
examples at all) and the errors they get: a table of cases, each run by
`test_bad_model_input`. Each error used to be silent (a truncated float id,
a mask of 2s, a label out of range), another library's (Keras' attention
layer on a mask of another shape) or a crash (`UnboundLocalError` on
`predict([])`)."""

import functools

import numpy as np
import pytest

from attention_zoo_keras.models import BertBackbone
from attention_zoo_keras.models import BertMaskedLM
from attention_zoo_keras.models import BertTextClassifier
from attention_zoo_keras.models import GPTBackbone
from attention_zoo_keras.models import TransformerBackbone
from attention_zoo_keras.models import ViLBERTBackbone
from attention_zoo_keras.models import ViLBERTImageTextRetriever
from attention_zoo_keras.models import ViLBERTVisualQuestionAnswerer

LENGTH = 6
VOCABULARY_SIZE = 10


@functools.cache
def _bert():
    return BertBackbone(
        vocabulary_size=VOCABULARY_SIZE, num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=8,
        max_sequence_length=LENGTH,
    )


@functools.cache
def _classifier():
    return BertTextClassifier(_bert(), num_classes=2)


@functools.cache
def _masked_lm():
    return BertMaskedLM(_bert())


@functools.cache
def _gpt():
    return GPTBackbone(
        vocabulary_size=VOCABULARY_SIZE, num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=8,
        max_sequence_length=LENGTH,
    )


@functools.cache
def _transformer():
    return TransformerBackbone(
        vocabulary_size=VOCABULARY_SIZE, num_encoder_layers=1, num_decoder_layers=1, num_heads=1, hidden_dim=4,
        intermediate_dim=8, max_sequence_length=LENGTH,
    )


@functools.cache
def _vilbert():
    return ViLBERTBackbone(
        vocabulary_size=VOCABULARY_SIZE, num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=8,
        region_feature_dim=3, visual_num_layers=1, visual_num_heads=1, visual_hidden_dim=4,
        visual_intermediate_dim=8, co_attention_dim=4, co_attention_num_heads=1,
        co_attention_text_layers=[1], co_attention_visual_layers=[1], max_sequence_length=LENGTH,
    )


def _vilbert_features(leading=(2,), **replace):
    """Valid ViLBERT features with `leading` axes (batch, or batch and
    candidates), 2 regions; `replace` swaps whole inputs."""
    features = {
        "token_ids": np.full((*leading, LENGTH), 5, dtype="int32"),
        "segment_ids": np.zeros((*leading, LENGTH), dtype="int32"),
        "padding_mask": np.ones((*leading, LENGTH), dtype="int32"),
        "region_features": np.ones((*leading, 2, 3), dtype="float32"),
        "region_boxes": np.tile(np.array([0, 0, 1, 1, 1], "float32"), (*leading, 2, 1)),
        "region_mask": np.ones((*leading, 2), dtype="int32"),
    }
    return {**features, **replace}


def _bert_features(**replace):
    """Valid BERT features `(2, LENGTH)`; `replace` swaps whole inputs."""
    features = {
        "token_ids": np.full((2, LENGTH), 5, dtype="int32"),
        "segment_ids": np.zeros((2, LENGTH), dtype="int32"),
        "padding_mask": np.ones((2, LENGTH), dtype="int32"),
    }
    return {**features, **replace}


def _with(array, value, dtype=None):
    """`array` (as `dtype`) with `value` at [0, 1]."""
    array = np.array(array, dtype=dtype or array.dtype)
    array[0, 1] = value
    return array


def _ids(value=5, dtype="int32"):
    return _with(np.full((2, LENGTH), 5), value, dtype)


def _seq2seq_features(**replace):
    ids, mask = np.full((2, LENGTH), 5, dtype="int32"), np.ones((2, LENGTH), dtype="int32")
    features = {
        "encoder_token_ids": ids, "encoder_padding_mask": mask,
        "decoder_token_ids": ids, "decoder_padding_mask": mask,
    }
    return {**features, **replace}


def _predict(model, x):
    return model.predict(x, verbose=0)


def _fit(model, x, y):
    if not model.compiled:
        model.compile(optimizer="sgd")
    return model.fit(x, y, verbose=0)


ONES = np.ones((2, LENGTH), dtype="int32")

CASES = [
    # --- token ids ---------------------------------------------------------
    ("id_out_of_vocabulary", lambda: _predict(_bert(), _bert_features(token_ids=_ids(10))),
     ValueError, r"'token_ids' holds the id 10, outside the valid range \[0, 10\)"),
    ("id_negative", lambda: _predict(_bert(), _bert_features(token_ids=_ids(-1))),
     ValueError, r"'token_ids' holds the id -1, outside the valid range \[0, 10\)"),
    ("id_float_truncated", lambda: _predict(_bert(), _bert_features(token_ids=_ids(3.7, "float32"))),
     ValueError, r"'token_ids' holds 3\.7, not a whole number: ids must be integers"),
    ("id_nan", lambda: _predict(_bert(), _bert_features(token_ids=_ids(np.nan, "float32"))),
     ValueError, r"'token_ids' holds nan, not a whole number"),
    ("id_strings", lambda: _predict(_bert(), _bert_features(token_ids=np.full((2, LENGTH), "the"))),
     ValueError, r"'token_ids' has dtype <U3; ids must be integers\. Tokenize text with the preprocessor"),
    ("id_float_in_call", lambda: _bert()(_bert_features(token_ids=_ids(2.5, "float64"))),
     ValueError, r"'token_ids' holds 2\.5, not a whole number"),
    ("ids_too_long", lambda: _predict(_bert(), _bert_features(
        token_ids=np.ones((2, 9), "int32"), segment_ids=np.zeros((2, 9), "int32"), padding_mask=np.ones((2, 9), "int32"))),
     ValueError, r"'token_ids' has length 9, longer than the model's maximum sequence length 6"),
    ("gpt_id_float", lambda: _predict(_gpt(), {"token_ids": _ids(1.5, "float32"), "padding_mask": ONES}),
     ValueError, r"'token_ids' holds 1\.5, not a whole number"),
    ("seq2seq_decoder_id_out_of_vocabulary",
     lambda: _predict(_transformer(), _seq2seq_features(decoder_token_ids=_ids(12))),
     ValueError, r"'decoder_token_ids' holds the id 12, outside the valid range \[0, 10\)"),
    # --- segment ids -------------------------------------------------------
    ("segment_id_out_of_range", lambda: _predict(_bert(), _bert_features(segment_ids=_with(np.zeros((2, LENGTH), "int32"), 2))),
     ValueError, r"'segment_ids' holds the id 2, outside the valid range \[0, 2\)"),
    ("segment_ids_other_shape", lambda: _predict(_bert(), _bert_features(segment_ids=np.zeros((2, 5), "int32"))),
     ValueError, r"'segment_ids' has shape \(2, 5\) but 'token_ids' has shape \(2, 6\); they must match"),
    # --- padding masks -----------------------------------------------------
    ("mask_value_2", lambda: _predict(_bert(), _bert_features(padding_mask=_with(ONES, 2))),
     ValueError, r"'padding_mask' holds 2; a mask holds only 1 \(attend\) or 0 \(padding\)"),
    ("mask_value_negative", lambda: _predict(_bert(), _bert_features(padding_mask=_with(ONES, -1))),
     ValueError, r"'padding_mask' holds -1; a mask holds only 1"),
    ("mask_value_half", lambda: _predict(_bert(), _bert_features(padding_mask=_with(ONES, 0.5, "float32"))),
     ValueError, r"'padding_mask' holds 0\.5; a mask holds only 1"),
    ("mask_other_length", lambda: _predict(_bert(), _bert_features(padding_mask=np.ones((2, 5), "int32"))),
     ValueError, r"'padding_mask' has shape \(2, 5\) but 'token_ids' has shape \(2, 6\); they must match"),
    ("mask_other_batch", lambda: _bert()(_bert_features(padding_mask=np.ones((1, LENGTH), "int32"))),
     ValueError, r"'padding_mask' has shape \(1, 6\) but 'token_ids' has shape \(2, 6\)"),
    ("gpt_mask_other_length", lambda: _predict(_gpt(), {"token_ids": _ids(), "padding_mask": np.ones((2, 4), "int32")}),
     ValueError, r"'padding_mask' has shape \(2, 4\) but 'token_ids' has shape \(2, 6\)"),
    ("gpt_mask_value_3", lambda: _predict(_gpt(), {"token_ids": _ids(), "padding_mask": _with(ONES, 3)}),
     ValueError, r"'padding_mask' holds 3; a mask holds only 1"),
    ("seq2seq_decoder_mask_other_length",
     lambda: _predict(_transformer(), _seq2seq_features(decoder_padding_mask=np.ones((2, 3), "int32"))),
     ValueError, r"'decoder_padding_mask' has shape \(2, 3\) but 'decoder_token_ids' has shape \(2, 6\)"),
    ("seq2seq_encoder_mask_value", lambda: _predict(_transformer(), _seq2seq_features(encoder_padding_mask=_with(ONES, 7))),
     ValueError, r"'encoder_padding_mask' holds 7; a mask holds only 1"),
    # --- feature names -----------------------------------------------------
    ("feature_name_misspelled",
     lambda: _predict(_bert(), {**_bert_features(), "padding_msk": ONES}),
     ValueError, r"BertBackbone has no input named 'padding_msk'\. Did you mean: padding_mask\?"),
    ("feature_missing", lambda: _predict(_gpt(), {"token_ids": _ids()}),
     ValueError, r"GPTBackbone needs the input 'padding_mask'; got only 'token_ids'"),
    # --- class labels ------------------------------------------------------
    ("label_out_of_range", lambda: _fit(_classifier(), _bert_features(), np.array([5, 0])),
     ValueError, r"The labels hold the class 5; there are 2 classes \(indices 0 to 1\)"),
    ("label_negative", lambda: _fit(_classifier(), _bert_features(), np.array([-1, 0])),
     ValueError, r"The labels hold the class -1; there are 2 classes"),
    ("label_fractional", lambda: _fit(_classifier(), _bert_features(), np.array([0.5, 0.0])),
     ValueError, r"'labels' holds 0\.5, not a whole number"),
    ("label_one_hot_too_wide", lambda: _fit(_classifier(), _bert_features(), np.eye(3)[:2]),
     ValueError, r"The labels have shape \(2, 3\): one-hot rows 3 wide, but there are 2 classes"),
    ("label_on_train_on_batch", lambda: _classifier().train_on_batch(_bert_features(), np.array([2, 0])),
     ValueError, r"The labels hold the class 2; there are 2 classes"),
    ("masked_lm_label_out_of_vocabulary",
     lambda: _fit(_masked_lm(), {**_bert_features(), "mask_positions": np.ones((2, 1), "int32")}, np.array([[3], [10]])),
     ValueError, r"'labels' holds the id 10, outside the valid range \[0, 10\)"),
    ("vilbert_region_mask_value", lambda: _predict(_vilbert(), _vilbert_features(region_mask=np.full((2, 2), 2))),
     ValueError, r"'region_mask' holds 2; a mask holds only 1"),
    ("vqa_soft_score_above_one",
     lambda: _fit(ViLBERTVisualQuestionAnswerer(_vilbert(), num_answers=3), _vilbert_features(), np.full((2, 3), 1.5)),
     ValueError, r"The labels hold 1\.5; soft targets are scores in \[0, 1\]"),
    ("vqa_soft_scores_other_width",
     lambda: _fit(ViLBERTVisualQuestionAnswerer(_vilbert(), num_answers=3), _vilbert_features(), np.zeros((2, 4))),
     ValueError, r"The labels have shape \(2, 4\); they must be rows of 3 scores"),
    ("retrieval_label_beyond_the_candidates",
     lambda: _fit(ViLBERTImageTextRetriever(_vilbert()), _vilbert_features(leading=(2, 3)), np.array([3, 0])),
     ValueError, r"The labels hold the class 3; there are 3 candidates \(indices 0 to 2\)"),
    # --- no examples -------------------------------------------------------
    ("predict_empty_list", lambda: _predict(_classifier(), []),
     ValueError, r"BertTextClassifier\.predict\(\) got no examples \(x=\[\]\)\. It takes a dict of arrays "
                 r"\(token_ids, segment_ids, padding_mask\)"),
    ("predict_none", lambda: _predict(_bert(), None),
     ValueError, r"BertBackbone\.predict\(\) got no examples \(x=None\)"),
    ("fit_none", lambda: _fit(_classifier(), None, None),
     ValueError, r"BertTextClassifier\.fit\(\) got no examples \(x=None\)"),
    ("evaluate_zero_rows", lambda: _classifier().evaluate(
        {key: value[:0] for key, value in _bert_features().items()}, np.zeros((0,)), verbose=0),
     ValueError, r"BertTextClassifier\.evaluate\(\) got no examples \('token_ids' has 0 rows\)"),
    ("predict_on_batch_none", lambda: _bert().predict_on_batch(None),
     ValueError, r"BertBackbone\.predict_on_batch\(\) got no examples \(x=None\)"),
]


def test_the_table_is_well_formed():
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 20


@pytest.mark.parametrize(("run", "error", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_model_input(run, error, message):
    with pytest.raises(error, match=message):
        run()
