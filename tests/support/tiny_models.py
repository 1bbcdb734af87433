"""Tiny models of every family, one per task, with inputs for them: the
cases that tests run across all families (recorded steps, quantization,
LoRA). Each case is `name -> () -> (model, inputs of 8 examples)`; every
call builds a fresh model (seed Keras first for equal weights) and the same
inputs, whichever tests ran before."""

import keras
import numpy as np

import attention_zoo_keras as azk

rng = np.random.default_rng(0)


def random_ids(batch, length, vocabulary=30):
    return rng.integers(1, vocabulary, (batch, length)).astype("int32")


def padded_mask(batch, length):
    """Ones, with the second half of the rows padded after position 2."""
    mask = np.ones((batch, length), "int32")
    mask[batch // 2 :, 3:] = 0
    return mask


def tiny_bert(num_layers=1, **overrides):
    arguments = dict(vocabulary_size=30, num_layers=num_layers, num_heads=2, hidden_dim=8, intermediate_dim=16,
                     max_sequence_length=16)
    return azk.models.BertBackbone(**{**arguments, **overrides})


def tiny_gpt(**overrides):
    arguments = dict(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                     max_sequence_length=16)
    return azk.models.GPTBackbone(**{**arguments, **overrides})


def text_features(batch, length):
    return {"token_ids": random_ids(batch, length), "segment_ids": np.zeros((batch, length), "int32"),
            "padding_mask": padded_mask(batch, length)}


def tiny_reformer(hash_seed):
    return azk.models.ReformerBackbone(
        vocabulary_size=30, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
        attention=["local", "lsh"],
        attention_options={"lsh": {"num_hashes": 1, "num_buckets": [2, 2], "chunk_length": 4, "seed": hash_seed},
                           "local": {"block_size": 4}},
        axial_pos_shape=(2, 4), axial_pos_embds_dim=(4, 4), dropout=0.0, attention_dropout=0.0,
    )


def vilbert_features(batch):
    return {
        "token_ids": random_ids(batch, 6, vocabulary=20), "segment_ids": np.zeros((batch, 6), "int32"),
        "padding_mask": padded_mask(batch, 6),
        "region_features": rng.normal(size=(batch, 3, 4)).astype("float32"),
        "region_boxes": np.tile(np.array([0.1, 0.1, 0.5, 0.5, 0.16], "float32"), (batch, 3, 1)),
        "region_mask": np.ones((batch, 3), "int32"),
    }


def _same_inputs_every_time(build):
    def built():
        rng.bit_generator.state = np.random.default_rng(0).bit_generator.state
        return build()

    return built


def task_cases():
    """`{name: () -> (model, inputs of 8 examples)}`, one per family's task."""
    cases = {
        "bert_classifier": lambda: (
            azk.models.BertTextClassifier(tiny_bert(2), num_classes=3, dropout=0.0), text_features(8, 12)),
        "bert_masked_lm": lambda: (
            azk.models.BertMaskedLM(tiny_bert()),
            {**text_features(8, 12), "mask_positions": np.tile(np.array([1, 4], "int32"), (8, 1))}),
        "gpt_causal_lm": lambda: (
            azk.models.GPTCausalLM(tiny_gpt()), {"token_ids": random_ids(8, 10), "padding_mask": padded_mask(8, 10)}),
        "gpt_linear_attention": lambda: (
            azk.models.GPTCausalLM(tiny_gpt(attention="linear", attention_dropout=0.0)),
            {"token_ids": random_ids(8, 10), "padding_mask": np.ones((8, 10), "int32")}),
        "vit_classifier": lambda: (
            azk.models.ViTImageClassifier(
                azk.models.ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                                       intermediate_dim=16), num_classes=3),
            {"images": rng.normal(size=(8, 16, 16, 3)).astype("float32")}),
        "seq2seq_lm": lambda: (
            azk.models.TransformerSeq2SeqLM(azk.models.TransformerBackbone(
                vocabulary_size=30, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=8,
                intermediate_dim=16, max_sequence_length=16)),
            {"encoder_token_ids": random_ids(8, 9), "encoder_padding_mask": padded_mask(8, 9),
             "decoder_token_ids": random_ids(8, 7), "decoder_padding_mask": np.ones((8, 7), "int32")}),
        "transformer_xl_backbone": lambda: (
            azk.models.TransformerXLBackbone(
                vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
                mem_len=4, cutoffs=[10, 20], div_val=2),
            {"token_ids": random_ids(8, 5), "memory": rng.normal(size=(8, 1, 4, 8)).astype("float32")}),
        "reformer_classifier": lambda: (
            azk.models.ReformerTextClassifier(tiny_reformer(hash_seed=0), num_classes=2),
            {"token_ids": random_ids(8, 8), "padding_mask": padded_mask(8, 8)}),
        "vilbert_vqa": lambda: (
            azk.models.ViLBERTVisualQuestionAnswerer(
                azk.models.ViLBERTBackbone(
                    vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                    region_feature_dim=4, visual_num_layers=1, visual_num_heads=2, visual_hidden_dim=8,
                    visual_intermediate_dim=16, co_attention_dim=8, co_attention_num_heads=2,
                    co_attention_text_layers=[1], co_attention_visual_layers=[0], max_sequence_length=8),
                num_answers=5),
            vilbert_features(8)),
    }
    return {name: _same_inputs_every_time(build) for name, build in cases.items()}


def zero_targets(model, x):
    """Regression targets of the model's output structure (all zeros)."""
    outputs = model(x, training=False)
    return keras.tree.map_structure(lambda value: np.zeros(keras.ops.shape(value), "float32"), outputs)


def weights_of(model):
    """`{variable path: numpy value}` of every weight of `model`."""
    return {variable.path: keras.ops.convert_to_numpy(variable) for variable in model.weights}


def outputs_of(model, x):
    """The model's outputs on `x` (inference), flattened, as numpy arrays."""
    return [keras.ops.convert_to_numpy(output) for output in keras.tree.flatten(model(x, training=False))]


def from_preset_like(model, directory):
    """`from_preset` of `model`'s class (a task without a preprocessor)."""
    if hasattr(model, "backbone"):
        return type(model).from_preset(directory, preprocessor=None)
    return type(model).from_preset(directory)
