"""Converts Hugging Face `transformers` GPT-2 checkpoints (`GPT2Model`, and
`GPT2LMHeadModel` with its `transformer.` prefix and tied `lm_head`).

GPT-2 uses `Conv1D` layers, whose weights are stored `(in, out)` — already
Keras `Dense` kernels, so unlike `nn.Linear` they are *not* transposed. The
query, key and value projections are fused in `attn.c_attn`, concatenated
along the output dimension in that order.
"""

import logging

import numpy as np

from attention_zoo_keras.hub.converters import TransformersConverter
from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import copy_layer_norm
from attention_zoo_keras.hub.converters import register_converter
from attention_zoo_keras.hub.transformers_export import write_tokenizer_config
from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.models.gpt.gpt_backbone import GPTBackbone
from attention_zoo_keras.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from attention_zoo_keras.models.gpt.gpt_tokenizer import END_TOKEN
from attention_zoo_keras.models.gpt.gpt_tokenizer import GPTTokenizer

logger = logging.getLogger(__name__)


def _check_supported(hf_config):
    """Raises for GPT-2 variants this backbone does not compute."""
    problems = []
    if not hf_config.get("scale_attn_weights", True):
        problems.append("'scale_attn_weights' is false (attention scores are not divided by √head_dim)")
    if hf_config.get("scale_attn_by_inverse_layer_idx", False):
        problems.append("'scale_attn_by_inverse_layer_idx' is true (scores are also divided by the layer index)")
    if hf_config.get("add_cross_attention", False):
        problems.append("'add_cross_attention' is true (blocks have encoder-decoder attention)")
    if not hf_config.get("tie_word_embeddings", True):
        problems.append("'tie_word_embeddings' is false (the LM head is not the token embedding)")
    activation = hf_config.get("activation_function", "gelu_new")
    try:
        get_activation(activation)
    except ValueError:
        problems.append(f"'activation_function' is '{activation}', an activation this library lacks")
    if problems:
        raise ValueError("This GPT-2 checkpoint cannot be converted: " + "; ".join(problems) + ".")
    if hf_config.get("reorder_and_upcast_attn", False):
        # Only changes the order and precision of the score computation (it upcasts
        # to float32); the result is the same function.
        logger.info("'reorder_and_upcast_attn' is ignored: attention is computed the usual way.")


# GPT-2's `<|endoftext|>`, `transformers`' default `bos_token_id` / `eos_token_id`.
GPT2_END_TOKEN_ID = 50256


class GPTConverter(TransformersConverter):
    model_type = "gpt2"
    backbone_cls = GPTBackbone
    preprocessor_cls = GPTCausalLMPreprocessor
    # The causal-mask buffers of older checkpoints; the LM head, tied to the
    # token embedding.
    ignored_source_keys = (r".*attn\.bias", r".*attn\.masked_bias", r"lm_head\.weight")
    checkpoint_sizes = {
        "vocabulary_size": ("token_embedding/embeddings", 0),
        "hidden_dim": ("token_embedding/embeddings", 1),
        "max_sequence_length": ("position_embedding/embeddings", 0),
        "intermediate_dim": ("transformer_layer_0/feed_forward/intermediate/kernel", 1),
    }

    def backbone_config(self, hf_config):
        _check_supported(hf_config)
        hidden_dim = hf_config.get("n_embd", 768)
        return {
            "vocabulary_size": hf_config.get("vocab_size", 50257),
            "num_layers": hf_config.get("n_layer", 12),
            "num_heads": hf_config.get("n_head", 12),
            "hidden_dim": hidden_dim,
            "intermediate_dim": hf_config.get("n_inner") or 4 * hidden_dim,
            "dropout": hf_config.get("resid_pdrop", 0.1),
            "attention_dropout": hf_config.get("attn_pdrop", 0.1),
            "max_sequence_length": hf_config.get("n_positions", 1024),
            "activation": hf_config.get("activation_function", "gelu_new"),
            "layer_norm_epsilon": hf_config.get("layer_norm_epsilon", 1e-5),
            "initializer_range": hf_config.get("initializer_range", 0.02),
        }

    def weights(self, hf_config, checkpoint):
        prefix = "transformer." if "transformer.wte.weight" in checkpoint else ""
        if f"{prefix}wte.weight" not in checkpoint:
            raise ValueError(
                "This checkpoint has no 'wte.weight' (with or without the 'transformer.' "
                "prefix); it is not a GPT-2 checkpoint."
            )
        arrays = {
            "token_embedding/embeddings": checkpoint[f"{prefix}wte.weight"],
            "position_embedding/embeddings": checkpoint[f"{prefix}wpe.weight"],
        }
        for index in range(hf_config.get("n_layer", 12)):
            theirs = f"{prefix}h.{index}"
            ours = f"transformer_layer_{index}"
            copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.ln_1", checkpoint)
            kernel = np.asarray(checkpoint[f"{theirs}.attn.c_attn.weight"])
            bias = np.asarray(checkpoint[f"{theirs}.attn.c_attn.bias"])
            for name, k, b in zip(("query", "key", "value"), np.split(kernel, 3, axis=-1), np.split(bias, 3)):
                arrays[f"{ours}/self_attention/{name}/kernel"] = k
                arrays[f"{ours}/self_attention/{name}/bias"] = b
            copy_dense(arrays, f"{ours}/self_attention/output", f"{theirs}.attn.c_proj", checkpoint, transpose=False)
            copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.ln_2", checkpoint)
            copy_dense(arrays, f"{ours}/feed_forward/intermediate", f"{theirs}.mlp.c_fc", checkpoint, transpose=False)
            copy_dense(arrays, f"{ours}/feed_forward/output", f"{theirs}.mlp.c_proj", checkpoint, transpose=False)
        copy_layer_norm(arrays, "final_norm", f"{prefix}ln_f", checkpoint)
        return arrays

    def tokenizer(self, source, hf_config):
        tokenizer_json = source.file("tokenizer.json")
        if tokenizer_json is not None:
            return GPTTokenizer.from_file(tokenizer_json)
        return GPTTokenizer.from_vocabulary(source.require("vocab.json"), source.require("merges.txt"))

    def preprocessor_config(self, source, hf_config):
        return {"sequence_length": hf_config.get("n_positions", 1024)}

    transformers_architectures = {"GPTBackbone": "GPT2Model", "GPTCausalLM": "GPT2LMHeadModel"}

    transformers_names = {
        "vocabulary_size": "vocab_size", "num_layers": "n_layer", "num_heads": "n_head", "hidden_dim": "n_embd",
        "intermediate_dim": "n_inner", "dropout": "resid_pdrop", "attention_dropout": "attn_pdrop",
        "max_sequence_length": "n_positions", "activation": "activation_function",
        "layer_norm_epsilon": "layer_norm_epsilon", "initializer_range": "initializer_range",
    }

    def transformers_config(self, model):
        hf_config = super().transformers_config(model)
        hf_config["embd_pdrop"] = hf_config["resid_pdrop"]  # one dropout rate here
        preprocessor = getattr(model, "preprocessor", None)
        if preprocessor is not None:
            end = preprocessor.tokenizer.end_token_id
            hf_config.update(bos_token_id=end, eos_token_id=end)
        elif hf_config["vocab_size"] <= GPT2_END_TOKEN_ID:  # not transformers' default id 50256, past the vocabulary
            hf_config.update(bos_token_id=None, eos_token_id=None)
        return hf_config

    def export_preprocessor(self, preprocessor, directory):
        preprocessor.tokenizer.save(directory)  # tokenizer.json, which transformers reads
        write_tokenizer_config(
            directory, "GPT2Tokenizer",
            bos_token=END_TOKEN, eos_token=END_TOKEN, unk_token=END_TOKEN, add_prefix_space=False,
            model_max_length=preprocessor.sequence_length,
        )


register_converter(GPTConverter())
