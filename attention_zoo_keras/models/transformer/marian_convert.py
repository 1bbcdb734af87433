"""Converts Hugging Face `transformers` Marian MT checkpoints
(`MarianMTModel`, `model_type: "marian"`: the Helsinki-NLP/opus-mt-* models)
into a `TransformerBackbone` and `TransformerSeq2SeqLM`.

Marian is the post-norm Transformer with SiLU ("swish") feed-forward
activations, token embeddings scaled by √d_model, tensor2tensor's sinusoid
layout (sines, then cosines), one embedding shared by the encoder, the
decoder and the output layer, and a bias on the logits
(`final_logits_bias`). `nn.Linear` weights are `(out, in)` and are
transposed. The sinusoid tables a checkpoint may hold are not read: the
backbone computes them.
"""

import logging

import numpy as np

from attention_zoo_keras.hub.converters import TransformersConverter
from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import NotExportableError
from attention_zoo_keras.hub.converters import copy_layer_norm
from attention_zoo_keras.hub.converters import register_converter
from attention_zoo_keras.hub.transformers_export import write_tokenizer_config
from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.models.transformer.transformer_backbone import TransformerBackbone
from attention_zoo_keras.models.transformer.transformer_seq2seq_lm_preprocessor import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.models.transformer.transformer_seq2seq_lm import TransformerSeq2SeqLM
from attention_zoo_keras.models.transformer.transformer_tokenizer import END_TOKEN
from attention_zoo_keras.models.transformer.transformer_tokenizer import PAD_TOKEN
from attention_zoo_keras.models.transformer.transformer_tokenizer import UNKNOWN_TOKEN
from attention_zoo_keras.models.transformer.transformer_tokenizer import TransformerTokenizer

logger = logging.getLogger(__name__)

# Where a checkpoint may keep the shared embedding (tied tensors are stored
# once), under the model's prefix; or as the output layer, `lm_head.weight`.
SHARED_EMBEDDING_NAMES = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _check_supported(hf_config):
    """Raises for Marian variants this backbone does not compute."""
    problems = []
    for ours, (encoder_key, decoder_key) in {
        "num_heads": ("encoder_attention_heads", "decoder_attention_heads"),
        "intermediate_dim": ("encoder_ffn_dim", "decoder_ffn_dim"),
    }.items():
        if hf_config.get(encoder_key) != hf_config.get(decoder_key):
            problems.append(f"'{encoder_key}' and '{decoder_key}' differ (one {ours} serves both stacks)")
    activation = hf_config.get("activation_function", "gelu")
    try:
        get_activation(activation)
    except ValueError:
        problems.append(f"'activation_function' is '{activation}', an activation this library lacks")
    if hf_config.get("normalize_before", False):
        problems.append("'normalize_before' is true (Marian checkpoints are post-norm)")
    if not hf_config.get("tie_word_embeddings", True):
        problems.append("'tie_word_embeddings' is false (the output layer is not the target embedding)")
    if problems:
        raise ValueError("This Marian checkpoint cannot be converted: " + "; ".join(problems) + ".")
    if hf_config.get("activation_dropout", 0.0):
        logger.info("'activation_dropout' is not applied (it only matters in training).")


def _copy_attention(arrays, ours, theirs, checkpoint):
    for our_name, their_name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"), ("output", "out_proj")):
        copy_dense(arrays, f"{ours}/{our_name}", f"{theirs}.{their_name}", checkpoint)


def _copy_feed_forward(arrays, ours, theirs, checkpoint):
    copy_dense(arrays, f"{ours}/feed_forward/intermediate", f"{theirs}.fc1", checkpoint)
    copy_dense(arrays, f"{ours}/feed_forward/output", f"{theirs}.fc2", checkpoint)


class MarianConverter(TransformersConverter):
    model_type = "marian"
    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerSeq2SeqLMPreprocessor
    # The copies of the shared embedding (one is read), the LM head tied to
    # it, and the sinusoidal positions, which are computed.
    ignored_source_keys = (
        r"(model\.)?(shared|encoder\.embed_tokens|decoder\.embed_tokens)\.weight",
        r"lm_head\.weight",
        r".*embed_positions\.weight",
        r".*position_ids",
    )
    head_keys = (r"lm_head/.*",)
    checkpoint_sizes = {
        "vocabulary_size": ("token_embedding/embeddings", 0),
        "hidden_dim": ("token_embedding/embeddings", 1),
    }

    def backbone_config(self, hf_config):
        _check_supported(hf_config)
        shared = hf_config.get("share_encoder_decoder_embeddings", True)
        vocabulary_size = hf_config.get("vocab_size", 58101)
        return {
            "vocabulary_size": vocabulary_size,
            "target_vocabulary_size": None if shared else hf_config.get("decoder_vocab_size") or vocabulary_size,
            "num_encoder_layers": hf_config.get("encoder_layers", 12),
            "num_decoder_layers": hf_config.get("decoder_layers", 12),
            "num_heads": hf_config.get("encoder_attention_heads", 16),
            "hidden_dim": hf_config.get("d_model", 1024),
            "intermediate_dim": hf_config.get("encoder_ffn_dim", 4096),
            "dropout": hf_config.get("dropout", 0.1),
            "attention_dropout": hf_config.get("attention_dropout", 0.0),
            "activation": hf_config.get("activation_function", "gelu"),
            "max_sequence_length": hf_config.get("max_position_embeddings", 1024),
            "position_embedding": "sinusoidal_concatenated",
            "scale_embeddings": hf_config.get("scale_embedding", False),
            "norm_first": False,
            "final_norm": False,
        }

    def weights(self, hf_config, checkpoint):
        prefix = "model." if any(key.startswith("model.") for key in checkpoint.keys()) else ""
        arrays = {}
        if hf_config.get("share_encoder_decoder_embeddings", True):
            candidates = [f"{prefix}{name}" for name in SHARED_EMBEDDING_NAMES] + ["lm_head.weight"]
            key = next((key for key in candidates if key in checkpoint), None)
            if key is None:
                raise ValueError(f"This checkpoint has none of {', '.join(candidates)}: it is not a Marian checkpoint.")
            arrays["token_embedding/embeddings"] = checkpoint[key]
        else:
            arrays["token_embedding/embeddings"] = checkpoint[f"{prefix}encoder.embed_tokens.weight"]
            arrays["target_token_embedding/embeddings"] = checkpoint[f"{prefix}decoder.embed_tokens.weight"]
        for index in range(hf_config.get("encoder_layers", 12)):
            theirs, ours = f"{prefix}encoder.layers.{index}", f"encoder_layer_{index}"
            _copy_attention(arrays, f"{ours}/self_attention", f"{theirs}.self_attn", checkpoint)
            copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.self_attn_layer_norm", checkpoint)
            _copy_feed_forward(arrays, ours, theirs, checkpoint)
            copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.final_layer_norm", checkpoint)
        for index in range(hf_config.get("decoder_layers", 12)):
            theirs, ours = f"{prefix}decoder.layers.{index}", f"decoder_layer_{index}"
            _copy_attention(arrays, f"{ours}/self_attention", f"{theirs}.self_attn", checkpoint)
            copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.self_attn_layer_norm", checkpoint)
            _copy_attention(arrays, f"{ours}/cross_attention", f"{theirs}.encoder_attn", checkpoint)
            copy_layer_norm(arrays, f"{ours}/cross_attention_norm", f"{theirs}.encoder_attn_layer_norm", checkpoint)
            _copy_feed_forward(arrays, ours, theirs, checkpoint)
            copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.final_layer_norm", checkpoint)
        if "final_logits_bias" in checkpoint:
            arrays["lm_head/bias"] = np.reshape(checkpoint["final_logits_bias"], (-1,))
        return arrays

    def task_config(self, task_cls, source, hf_config):
        if issubclass(task_cls, TransformerSeq2SeqLM):
            return {"logits_bias": True}
        return {}

    def tokenizer(self, source, hf_config):
        return TransformerTokenizer.from_marian(
            source.require("source.spm"), source.require("target.spm"), source.require("vocab.json")
        )

    def preprocessor_config(self, source, hf_config):
        tokenizer_config = source.json("tokenizer_config.json", required=False) or {}
        length = min(int(tokenizer_config.get("model_max_length", 512)), hf_config.get("max_position_embeddings", 512))
        return {
            "encoder_sequence_length": length,
            "decoder_sequence_length": length,
            "decoder_start_token_id": hf_config.get("decoder_start_token_id"),
        }

    transformers_architectures = {"TransformerBackbone": "MarianModel", "TransformerSeq2SeqLM": "MarianMTModel"}

    transformers_names = {
        "vocabulary_size": "vocab_size", "num_encoder_layers": "encoder_layers",
        "num_decoder_layers": "decoder_layers", "num_heads": "encoder_attention_heads", "hidden_dim": "d_model",
        "intermediate_dim": "encoder_ffn_dim", "dropout": "dropout", "attention_dropout": "attention_dropout",
        "activation": "activation_function", "max_sequence_length": "max_position_embeddings",
        "scale_embeddings": "scale_embedding",
    }

    def transformers_config(self, model):
        hf_config = super().transformers_config(model)
        backbone = getattr(model, "backbone", model)
        hf_config.update(
            decoder_attention_heads=hf_config["encoder_attention_heads"],
            decoder_ffn_dim=hf_config["encoder_ffn_dim"],
            share_encoder_decoder_embeddings=backbone.target_vocabulary_size is None,
            decoder_vocab_size=backbone.decoder_vocabulary_size,
            # Marian's padding id is its last, the decoder starts from it, and
            # `</s>` is 0; `generate` never emits padding and ends at the
            # length limit with `</s>`, as this library's does.
            pad_token_id=backbone.decoder_vocabulary_size - 1,
            decoder_start_token_id=backbone.decoder_vocabulary_size - 1,
            eos_token_id=0,
        )
        preprocessor = getattr(model, "preprocessor", None)
        if preprocessor is not None:
            hf_config.update(
                pad_token_id=preprocessor.tokenizer.pad_token_id,
                eos_token_id=preprocessor.tokenizer.end_token_id,
                decoder_start_token_id=preprocessor.decoder_start_token_id,
            )
        hf_config["forced_eos_token_id"] = hf_config["eos_token_id"]
        hf_config["bad_words_ids"] = [[hf_config["pad_token_id"]]]
        return hf_config

    def export_preprocessor(self, preprocessor, directory):
        """`source.spm`, `target.spm`, `vocab.json` and the settings of
        `transformers.MarianTokenizer`, which reads SentencePiece's own files
        (kept by a tokenizer built from a Marian checkpoint)."""
        tokenizer = preprocessor.tokenizer
        if tokenizer.sentencepiece_models is None:
            raise NotExportableError(
                "transformers' MarianTokenizer reads SentencePiece models (source.spm, target.spm), and "
                "this tokenizer has none (it was not read from a Marian checkpoint); export the model "
                "alone with export_to_transformers(directory, include_preprocessor=False)."
            )
        tokenizer.save_marian_files(directory)
        write_tokenizer_config(
            directory, "MarianTokenizer", eos_token=END_TOKEN, unk_token=UNKNOWN_TOKEN, pad_token=PAD_TOKEN,
            model_max_length=preprocessor.encoder_sequence_length,
        )


register_converter(MarianConverter())
