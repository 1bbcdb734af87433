"""Maps the ViLBERT authors' checkpoints (facebookresearch/vilbert-multi-task,
`vilbert/vilbert.py`: `BertModel`, held as `bert` by `VILBertForVLTasks` and
`BertForMultiModalPreTraining`) onto `ViLBERTBackbone`, and their heads
(`cls`, `vil_prediction`, `vil_logit`, `vision_logit`) onto the task heads.

Their checkpoints are torch `state_dict`s, not `transformers` repos, so no
converter is registered; the functions here take the `state_dict` (as numpy
arrays) and the authors' `BertConfig` as a dict. torch `nn.Linear` stores
`(out, in)`; Keras `Dense` kernels are `(in, out)`, so every linear weight is
transposed.

Their co-attention layer names the visual stream `1` and the text stream `2`:
`biattention.query1/key1/value1` project regions, `query2/key2/value2`
project text; the text queries (`query2`) attend over `key1/value1` and are
projected back by `biOutput.dense2` and normalised by `LayerNorm2`; the
region queries (`query1`) attend over `key2/value2`, then `dense1` and
`LayerNorm1`. Their `biOutput.q_dense1/q_dense2` are never used and are
not mapped.
"""

from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import copy_layer_norm
from attention_zoo_keras.models.bert.bert_convert import copy_bert_layer

# The authors' multi-task model (`task_specific_tokens`) has nn.Embedding(20, hidden).
AUTHORS_NUM_TASK_TOKENS = 20
# Options of the authors' BertConfig whose non-default values change the
# backbone's computation in ways this port does not reproduce.
UNSUPPORTED = {
    "with_coattention": True,
    "dynamic_attention": False,
    "fast_mode": False,
    "in_batch_pairs": False,
    "model": "bert",
}


def vilbert_backbone_config(authors_config):
    """`ViLBERTBackbone` arguments from the authors' `BertConfig` as a dict.

    Args:
        authors_config: dict. The authors' config
            (`bert_base_6layer_6conect.json` and the like), with their key
            names.

    Returns:
        A dict of `ViLBERTBackbone` arguments.

    Raises:
        ValueError: for options this port does not implement (no
            co-attention, dynamic attention, in-batch pairs, fast mode,
            RoBERTa embeddings).

    Example:

    >>> config = vilbert_backbone_config({
    ...     "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
    ...     "num_attention_heads": 12, "intermediate_size": 3072, "v_feature_size": 2048,
    ...     "v_hidden_size": 1024, "v_num_hidden_layers": 6, "v_num_attention_heads": 8,
    ...     "v_intermediate_size": 1024, "bi_hidden_size": 1024, "bi_num_attention_heads": 8,
    ...     "t_biattention_id": [6, 7, 8, 9, 10, 11], "v_biattention_id": [0, 1, 2, 3, 4, 5]})
    >>> config["co_attention_text_layers"], config["co_attention_dim"]
    ([6, 7, 8, 9, 10, 11], 1024)
    """
    for key, supported in UNSUPPORTED.items():
        value = authors_config.get(key, supported)
        if value != supported:
            raise ValueError(
                f"This ViLBERT config has {key}={value!r}; only {key}={supported!r} can be converted."
            )
    return {
        "vocabulary_size": authors_config["vocab_size"],
        "num_layers": authors_config["num_hidden_layers"],
        "num_heads": authors_config["num_attention_heads"],
        "hidden_dim": authors_config["hidden_size"],
        "intermediate_dim": authors_config["intermediate_size"],
        "region_feature_dim": authors_config["v_feature_size"],
        "visual_num_layers": authors_config["v_num_hidden_layers"],
        "visual_num_heads": authors_config["v_num_attention_heads"],
        "visual_hidden_dim": authors_config["v_hidden_size"],
        "visual_intermediate_dim": authors_config["v_intermediate_size"],
        "co_attention_dim": authors_config["bi_hidden_size"],
        "co_attention_num_heads": authors_config["bi_num_attention_heads"],
        "co_attention_text_layers": list(authors_config["t_biattention_id"]),
        "co_attention_visual_layers": list(authors_config["v_biattention_id"]),
        "dropout": authors_config.get("hidden_dropout_prob", 0.1),
        "attention_dropout": authors_config.get("attention_probs_dropout_prob", 0.1),
        "visual_dropout": authors_config.get("v_hidden_dropout_prob", 0.1),
        "visual_attention_dropout": authors_config.get("v_attention_probs_dropout_prob", 0.1),
        "max_sequence_length": authors_config.get("max_position_embeddings", 512),
        "num_segments": authors_config.get("type_vocab_size", 2),
        "activation": authors_config.get("hidden_act", "gelu"),
        "visual_activation": authors_config.get("v_hidden_act", "gelu"),
        "layer_norm_epsilon": 1e-12,
        "initializer_range": authors_config.get("initializer_range", 0.02),
        "num_task_tokens": AUTHORS_NUM_TASK_TOKENS if authors_config.get("task_specific_tokens") else 0,
    }


def _copy_connection_layer(arrays, ours, theirs, checkpoint):
    """One of their `BertConnectionLayer`s onto a `CoAttentionBlock`."""
    for stream, queries, keys_values, output in (("text", "2", "1", "2"), ("visual", "1", "2", "1")):
        attention = f"{ours}/{stream}_cross_attention"
        copy_dense(arrays, f"{attention}/query", f"{theirs}.biattention.query{queries}", checkpoint)
        copy_dense(arrays, f"{attention}/key", f"{theirs}.biattention.key{keys_values}", checkpoint)
        copy_dense(arrays, f"{attention}/value", f"{theirs}.biattention.value{keys_values}", checkpoint)
        copy_dense(arrays, f"{attention}/output", f"{theirs}.biOutput.dense{output}", checkpoint)
        copy_layer_norm(arrays, f"{ours}/{stream}_attention_norm", f"{theirs}.biOutput.LayerNorm{output}", checkpoint)
    for stream, prefix in (("text", "t"), ("visual", "v")):
        copy_dense(arrays, f"{ours}/{stream}_feed_forward/intermediate", f"{theirs}.{prefix}_intermediate.dense", checkpoint)
        copy_dense(arrays, f"{ours}/{stream}_feed_forward/output", f"{theirs}.{prefix}_output.dense", checkpoint)
        copy_layer_norm(arrays, f"{ours}/{stream}_output_norm", f"{theirs}.{prefix}_output.LayerNorm", checkpoint)


def vilbert_arrays(state_dict, config):
    """`ViLBERTBackbone` variable keys → arrays from the authors' `state_dict`.

    Args:
        state_dict: dict. `{name: numpy array}` with the authors' parameter
            names, with or without the `bert.` prefix (the heads' parameters
            are ignored).
        config: dict. The authors' `BertConfig` (layer counts).

    Returns:
        A dict for `ViLBERTBackbone.assign_arrays`.

    Raises:
        ValueError: if the state_dict holds no ViLBERT embeddings.
    """
    prefix = "bert." if "bert.v_embeddings.image_embeddings.weight" in state_dict else ""
    if f"{prefix}v_embeddings.image_embeddings.weight" not in state_dict:
        raise ValueError(
            "This state_dict has no 'v_embeddings.image_embeddings.weight' (with or without the "
            "'bert.' prefix); it is not a ViLBERT checkpoint."
        )
    arrays = {}
    arrays["token_embedding/embeddings"] = state_dict[f"{prefix}embeddings.word_embeddings.weight"]
    arrays["position_embedding/embeddings"] = state_dict[f"{prefix}embeddings.position_embeddings.weight"]
    arrays["segment_embedding/embeddings"] = state_dict[f"{prefix}embeddings.token_type_embeddings.weight"]
    copy_layer_norm(arrays, "embeddings_norm", f"{prefix}embeddings.LayerNorm", state_dict)
    if config.get("task_specific_tokens"):
        arrays["task_embedding/embeddings"] = state_dict[f"{prefix}embeddings.task_embeddings.weight"]
    copy_dense(arrays, "region_embedding", f"{prefix}v_embeddings.image_embeddings", state_dict)
    copy_dense(arrays, "box_embedding", f"{prefix}v_embeddings.image_location_embeddings", state_dict)
    copy_layer_norm(arrays, "visual_embeddings_norm", f"{prefix}v_embeddings.LayerNorm", state_dict)
    encoder = f"{prefix}encoder"
    for index in range(config["num_hidden_layers"]):
        copy_bert_layer(arrays, f"transformer_layer_{index}", f"{encoder}.layer.{index}", state_dict)
    for index in range(config["v_num_hidden_layers"]):
        copy_bert_layer(arrays, f"visual_transformer_layer_{index}", f"{encoder}.v_layer.{index}", state_dict)
    for index in range(len(config["t_biattention_id"])):
        _copy_connection_layer(arrays, f"co_attention_layer_{index}", f"{encoder}.c_layer.{index}", state_dict)
    copy_dense(arrays, "pooler", f"{prefix}t_pooler.dense", state_dict)
    copy_dense(arrays, "visual_pooler", f"{prefix}v_pooler.dense", state_dict)
    return arrays


def vilbert_pretraining_head_arrays(state_dict):
    """`ViLBERTPretrainer` head keys → arrays from the authors' `state_dict`
    (`BertForMultiModalPreTraining` or `VILBertForVLTasks`, both hold the
    heads as `cls`).

    `cls.predictions.decoder.weight` is the word embedding matrix (tied), so
    only its bias is read; `cls.imagePredictions` is the region head,
    `cls.bi_seq_relationship` the alignment head.

    Args:
        state_dict: dict. `{name: numpy array}` with the authors' names.

    Returns:
        dict. Head keys → arrays; merge it with `vilbert_arrays(...)` for
        `ViLBERTPretrainer.assign_arrays`.

    Raises:
        ValueError: if the state_dict lacks the pretraining heads.
    """
    if "cls.bi_seq_relationship.weight" not in state_dict:
        raise ValueError(
            "This state_dict has no 'cls.bi_seq_relationship.weight'; it holds no ViLBERT pretraining heads."
        )
    arrays = {}
    copy_dense(arrays, "mlm_head/transform", "cls.predictions.transform.dense", state_dict)
    copy_layer_norm(arrays, "mlm_head/transform_norm", "cls.predictions.transform.LayerNorm", state_dict)
    arrays["mlm_head/output_bias"] = state_dict["cls.predictions.bias"]
    copy_dense(arrays, "region_head_transform", "cls.imagePredictions.transform.dense", state_dict)
    copy_layer_norm(arrays, "region_head_norm", "cls.imagePredictions.transform.LayerNorm", state_dict)
    copy_dense(arrays, "region_logits", "cls.imagePredictions.decoder", state_dict)
    copy_dense(arrays, "alignment_logits", "cls.bi_seq_relationship", state_dict)
    return arrays


def vilbert_vqa_head_arrays(state_dict, head="vil_prediction"):
    """`ViLBERTVisualQuestionAnswerer` head keys → arrays from the authors'
    `state_dict` (`VILBertForVLTasks`).

    Their `SimpleClassifier` is `logit_fc = Sequential(Linear, GeLU,
    BertLayerNorm, Linear)`, so its parameters are `logit_fc.0` (first
    linear), `logit_fc.2` (layer norm) and `logit_fc.3` (answer logits).

    Args:
        state_dict: dict. `{name: numpy array}` with the authors' names.
        head: str. `"vil_prediction"` (VQA, 3129 answers) or
            `"vil_prediction_gqa"` (GQA, 1533 answers), same structure.

    Returns:
        dict. Head keys → arrays; merge it with `vilbert_arrays(...)` for
        `ViLBERTVisualQuestionAnswerer.assign_arrays`.

    Raises:
        ValueError: if the state_dict lacks that head.

    Example:

    >>> import numpy as np
    >>> sd = {"vil_prediction.logit_fc.0.weight": np.zeros((8, 4)), "vil_prediction.logit_fc.0.bias": np.zeros(8),
    ...       "vil_prediction.logit_fc.2.weight": np.ones(8), "vil_prediction.logit_fc.2.bias": np.zeros(8),
    ...       "vil_prediction.logit_fc.3.weight": np.zeros((5, 8)), "vil_prediction.logit_fc.3.bias": np.zeros(5)}
    >>> {k: v.shape for k, v in sorted(vilbert_vqa_head_arrays(sd).items())}["vqa_hidden/kernel"]
    (4, 8)
    """
    theirs = f"{head}.logit_fc"
    if f"{theirs}.0.weight" not in state_dict:
        raise ValueError(f"This state_dict has no '{theirs}.0.weight'; it holds no ViLBERT '{head}' head.")
    arrays = {}
    copy_dense(arrays, "vqa_hidden", f"{theirs}.0", state_dict)
    copy_layer_norm(arrays, "vqa_hidden_norm", f"{theirs}.2", state_dict)
    copy_dense(arrays, "vqa_logits", f"{theirs}.3", state_dict)
    return arrays


def _linear_head_arrays(state_dict, ours, theirs, head):
    """A head that is one of their `nn.Linear`s onto one `Dense`; raises a
    `ValueError` naming the `head` when the state_dict lacks it."""
    if f"{theirs}.weight" not in state_dict:
        raise ValueError(f"This state_dict has no '{theirs}.weight'; it holds no ViLBERT {head} head.")
    arrays = {}
    copy_dense(arrays, ours, theirs, state_dict)
    return arrays


def vilbert_retrieval_head_arrays(state_dict):
    """`ViLBERTImageTextRetriever` head arrays from the authors' `vil_logit`,
    their `Linear(bi_hidden_size, 1)` on the fused pooled outputs
    (`VILBertForVLTasks`); merge them with `vilbert_arrays(...)`.

    Args:
        state_dict: dict. `{name: numpy array}` with the authors' names;
            a `ValueError` if it has no `vil_logit`.
    """
    return _linear_head_arrays(state_dict, "retrieval_score", "vil_logit", "retrieval")


def vilbert_region_scorer_head_arrays(state_dict):
    """`ViLBERTRegionScorer` head arrays from the authors' `vision_logit`.

    Args:
        state_dict: dict. `{name: numpy array}` with the authors' names.

    Returns:
        dict. `region_score`'s kernel and bias, their `Linear(v_hidden_size, 1)`
        on every region's final visual state.

    Raises:
        ValueError: if the state_dict lacks that head.
    """
    return _linear_head_arrays(state_dict, "region_score", "vision_logit", "region-scoring")
