"""Converts Hugging Face `transformers` Reformer checkpoints (`ReformerModel`,
`ReformerModelWithLMHead`, `ReformerForMaskedLM`,
`ReformerForSequenceClassification`; `model_type` "reformer").

Where their tensors go (`nn.Linear` weights `(out, in)` are transposed
into Keras kernels):

- `embeddings.word_embeddings` → `token_embedding`;
  `embeddings.position_embeddings.weights.{0,1}` → the axial tables
  (same shapes), or `.embedding` → the learned table;
- `encoder.layers.{l}.attention`: `layer_norm`, `self_attention.query_key`
  (LSH: queries and keys share it) or `query` and `key` (local), `value`,
  and `output.dense` → `reversible/attention_{l}`;
- `encoder.layers.{l}.feed_forward`: `layer_norm`, `dense.dense`,
  `output.dense` → `reversible/feed_forward_{l}`;
- `encoder.layer_norm` (over 2·hidden) → `final_norm`;
- `lm_head.decoder.weight` → `lm_head/kernel`, `lm_head.decoder.bias`
  (or, where absent, `lm_head.bias`) → `lm_head/bias` (kept, although
  `transformers` 5.0-5.23 do not add it);
- `classifier.dense`, `classifier.out_proj` → `classifier_dense`,
  `classifier_out_proj` (`ReformerTextClassifier`).

The flat `attn_layers`, `lsh_*`, `local_*`, `num_hashes`, `num_buckets`
and `*_attention_probs_dropout_prob` settings become `attention`,
`attention_options["lsh"]` and `["local"]` (under the mechanisms' option
names) and `attention_dropout`; `hash_seed` becomes the LSH `seed` (the
same rotations at every call, but drawn by numpy, not torch: hashing agrees
with `transformers` only when both hash with the same rotations, which
`ReformerBackbone.set_lsh_rotations` sets; not saved).
"""

import numpy as np

from attention_zoo_keras.hub.converters import NotExportableError
from attention_zoo_keras.hub.converters import TransformersConverter
from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import copy_layer_norm
from attention_zoo_keras.hub.converters import register_converter
from attention_zoo_keras.hub.transformers_export import write_tokenizer_config
from attention_zoo_keras.models.reformer.reformer_attention_options import DEFAULT_ATTENTION
from attention_zoo_keras.models.reformer.reformer_backbone import ReformerBackbone
from attention_zoo_keras.models.reformer.reformer_causal_lm_preprocessor import ReformerCausalLMPreprocessor
from attention_zoo_keras.models.reformer.reformer_text_classifier import ReformerTextClassifier
from attention_zoo_keras.models.reformer.reformer_tokenizer import END_TOKEN
from attention_zoo_keras.models.reformer.reformer_tokenizer import UNKNOWN_TOKEN
from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer
from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerTokenizer

BYTE_VOCABULARY_SIZE = 258  # google/reformer-enwik8: bytes + 2, no tokenizer files
DEFAULT_SEQUENCE_LENGTH = 1024


def _check_supported(hf_config):
    unknown = sorted(set(hf_config.get("attn_layers", [])) - {"lsh", "local"})
    if unknown:
        raise ValueError(
            f"This Reformer checkpoint cannot be converted: 'attn_layers' names {unknown}; only 'lsh' and 'local' "
            "exist."
        )


class ReformerConverter(TransformersConverter):
    model_type = "reformer"
    backbone_cls = ReformerBackbone
    preprocessor_cls = ReformerCausalLMPreprocessor
    # The LM head's bias: checkpoints saved before transformers 5.x hold it
    # twice, tied (`lm_head.bias`, `lm_head.decoder.bias`); 5.0-5.23 save only
    # `lm_head.bias` (and do not add it); 5.24 adds `lm_head.decoder.bias`
    # (and not `lm_head.bias`). The decoder's is read when present.
    ignored_source_keys = (r"lm_head\.(decoder\.)?bias",)
    head_keys = (r"lm_head/.*",)

    def backbone_config(self, hf_config):
        _check_supported(hf_config)
        axial = hf_config.get("axial_pos_embds", True)
        num_buckets = hf_config.get("num_buckets")
        return {
            "vocabulary_size": hf_config.get("vocab_size", 320),
            "hidden_dim": hf_config.get("hidden_size", 256),
            "num_heads": hf_config.get("num_attention_heads", 12),
            "head_dim": hf_config.get("attention_head_size", 64),
            "intermediate_dim": hf_config.get("feed_forward_size", 512),
            "attention": list(hf_config.get("attn_layers", DEFAULT_ATTENTION)),
            "num_layers": len(hf_config.get("attn_layers", DEFAULT_ATTENTION)),
            "attention_options": {
                "lsh": {
                    "num_hashes": hf_config.get("num_hashes", 1),
                    "num_buckets": list(num_buckets) if isinstance(num_buckets, (list, tuple)) else num_buckets,
                    "chunk_length": hf_config.get("lsh_attn_chunk_length", 64),
                    "num_chunks_before": hf_config.get("lsh_num_chunks_before", 1),
                    "num_chunks_after": hf_config.get("lsh_num_chunks_after", 0),
                    "seed": hf_config.get("hash_seed"),
                },
                "local": {
                    "block_size": hf_config.get("local_attn_chunk_length", 64),
                    "num_memory_blocks": hf_config.get("local_num_chunks_before", 1),
                    "num_memory_blocks_after": hf_config.get("local_num_chunks_after", 0),
                },
            },
            "is_causal": hf_config.get("is_decoder", False),
            "axial_pos_shape": list(hf_config.get("axial_pos_shape", [64, 64])) if axial else None,
            "axial_pos_embds_dim": list(hf_config.get("axial_pos_embds_dim", [64, 192])) if axial else None,
            "max_sequence_length": hf_config.get("max_position_embeddings", 4096),
            "activation": hf_config.get("hidden_act", "relu"),
            "dropout": hf_config.get("hidden_dropout_prob", 0.05),
            "attention_dropout": {
                "lsh": hf_config.get("lsh_attention_probs_dropout_prob", 0.0),
                "local": hf_config.get("local_attention_probs_dropout_prob", 0.05),
            },
            "layer_norm_epsilon": hf_config.get("layer_norm_eps", 1e-12),
            "feed_forward_chunk_size": hf_config.get("chunk_size_feed_forward") or None,
            "initializer_range": hf_config.get("initializer_range", 0.02),
            "axial_norm_std": hf_config.get("axial_norm_std", 1.0),
            "pad_token_id": hf_config.get("pad_token_id") or 0,
        }

    def weights(self, hf_config, checkpoint):
        config = self.backbone_config(hf_config)
        prefix = "reformer." if "reformer.embeddings.word_embeddings.weight" in checkpoint else ""
        if f"{prefix}embeddings.word_embeddings.weight" not in checkpoint:
            raise ValueError(
                "This checkpoint has no 'embeddings.word_embeddings.weight' (with or without the 'reformer.' "
                "prefix); it is not a Reformer checkpoint."
            )
        arrays = {"token_embedding/embeddings": checkpoint[f"{prefix}embeddings.word_embeddings.weight"]}
        positions = f"{prefix}embeddings.position_embeddings"
        if config["axial_pos_shape"] is not None:
            arrays["position_embedding/embeddings_0"] = checkpoint[f"{positions}.weights.0"]
            arrays["position_embedding/embeddings_1"] = checkpoint[f"{positions}.weights.1"]
        else:
            arrays["position_embedding/embeddings"] = checkpoint[f"{positions}.embedding.weight"]
        for index, attention in enumerate(config["attention"]):
            theirs = f"{prefix}encoder.layers.{index}"
            ours = f"reversible/attention_{index}"
            copy_layer_norm(arrays, f"{ours}/norm", f"{theirs}.attention.layer_norm", checkpoint)
            projections = {"query": "query_key", "value": "value"} if attention == "lsh" else {
                "query": "query", "key": "key", "value": "value"
            }
            for name, their_name in projections.items():
                weight = np.asarray(checkpoint[f"{theirs}.attention.self_attention.{their_name}.weight"])
                arrays[f"{ours}/self_attention/{name}/kernel"] = weight.T
            output = np.asarray(checkpoint[f"{theirs}.attention.output.dense.weight"])
            arrays[f"{ours}/self_attention/output/kernel"] = output.T
            ours = f"reversible/feed_forward_{index}"
            copy_layer_norm(arrays, f"{ours}/norm", f"{theirs}.feed_forward.layer_norm", checkpoint)
            copy_dense(arrays, f"{ours}/feed_forward/intermediate", f"{theirs}.feed_forward.dense.dense", checkpoint)
            copy_dense(arrays, f"{ours}/feed_forward/output", f"{theirs}.feed_forward.output.dense", checkpoint)
        copy_layer_norm(arrays, "final_norm", f"{prefix}encoder.layer_norm", checkpoint)
        if "lm_head.decoder.weight" in checkpoint:
            arrays["lm_head/kernel"] = np.asarray(checkpoint["lm_head.decoder.weight"]).T
            bias = "lm_head.decoder.bias" if "lm_head.decoder.bias" in checkpoint else "lm_head.bias"
            arrays["lm_head/bias"] = checkpoint[bias]
        if "classifier.dense.weight" in checkpoint:
            copy_dense(arrays, "classifier_dense", "classifier.dense", checkpoint)
            copy_dense(arrays, "classifier_out_proj", "classifier.out_proj", checkpoint)
        return arrays

    def task_config(self, task_cls, source, hf_config):
        """A `ReformerForSequenceClassification` checkpoint's number of classes
        (`id2label`'s size, else `num_labels`, else 2) and its
        `classifier_dropout` where set."""
        if not issubclass(task_cls, ReformerTextClassifier):
            return {}
        if "ReformerForSequenceClassification" not in (hf_config.get("architectures") or []):
            return {}
        labels = hf_config.get("id2label") or {}
        settings = {"num_classes": len(labels) or hf_config.get("num_labels", 2)}
        if hf_config.get("classifier_dropout") is not None:
            settings["dropout"] = hf_config["classifier_dropout"]
        return settings

    def tokenizer(self, source, hf_config):
        tokenizer_json = source.file("tokenizer.json")
        if tokenizer_json is not None:
            return ReformerTokenizer.from_file(tokenizer_json)
        sentencepiece = source.file("spiece.model")
        if sentencepiece is not None:
            return ReformerTokenizer.from_sentencepiece(sentencepiece)
        if hf_config.get("vocab_size") == BYTE_VOCABULARY_SIZE:
            return ReformerByteTokenizer()
        raise FileNotFoundError(
            f"Preset '{source.description}' has no Reformer tokenizer: no tokenizer.json or spiece.model, and "
            f"its vocabulary of {hf_config.get('vocab_size')} ids is not the {BYTE_VOCABULARY_SIZE} byte ids."
        )

    def preprocessor_config(self, source, hf_config):
        return {"sequence_length": min(hf_config.get("max_position_embeddings", 4096), DEFAULT_SEQUENCE_LENGTH)}

    transformers_architectures = {
        "ReformerBackbone": "ReformerModel",
        "ReformerCausalLM": "ReformerModelWithLMHead",
        "ReformerMaskedLM": "ReformerForMaskedLM",
        "ReformerTextClassifier": "ReformerForSequenceClassification",
    }

    transformers_names = {
        "vocabulary_size": "vocab_size", "hidden_dim": "hidden_size", "num_heads": "num_attention_heads",
        "head_dim": "attention_head_size", "intermediate_dim": "feed_forward_size", "attention": "attn_layers",
        "is_causal": "is_decoder", "max_sequence_length": "max_position_embeddings", "activation": "hidden_act",
        "dropout": "hidden_dropout_prob", "layer_norm_epsilon": "layer_norm_eps",
        "initializer_range": "initializer_range", "axial_norm_std": "axial_norm_std", "pad_token_id": "pad_token_id",
    }
    # `{transformers config key: (mechanism, option)}`: the attention options.
    transformers_attention_options = {
        "num_hashes": ("lsh", "num_hashes"), "num_buckets": ("lsh", "num_buckets"),
        "lsh_attn_chunk_length": ("lsh", "chunk_length"), "lsh_num_chunks_before": ("lsh", "num_chunks_before"),
        "lsh_num_chunks_after": ("lsh", "num_chunks_after"), "hash_seed": ("lsh", "seed"),
        "local_attn_chunk_length": ("local", "block_size"), "local_num_chunks_before": ("local", "num_memory_blocks"),
        "local_num_chunks_after": ("local", "num_memory_blocks_after"),
    }

    def transformers_config(self, model):
        hf_config = super().transformers_config(model)
        backbone = getattr(model, "backbone", model)
        options = backbone.attention_options
        hf_config.update(
            {key: options[name][option] for key, (name, option) in self.transformers_attention_options.items()}
        )
        hf_config.update(
            lsh_attention_probs_dropout_prob=backbone.attention_dropout["lsh"],
            local_attention_probs_dropout_prob=backbone.attention_dropout["local"],
            chunk_size_feed_forward=backbone.feed_forward_chunk_size or 0,
            axial_pos_embds=backbone.axial_pos_shape is not None,
        )
        if backbone.axial_pos_shape is not None:
            hf_config.update(
                axial_pos_shape=list(backbone.axial_pos_shape), axial_pos_embds_dim=list(backbone.axial_pos_embds_dim)
            )
        if isinstance(model, ReformerTextClassifier):
            hf_config.update(num_labels=model.num_classes, classifier_dropout=model.dropout)
        return hf_config

    def export_preprocessor(self, preprocessor, directory):
        """`tokenizer.json` (the `tokenizers` model this tokenizer is, which
        `transformers`' `ReformerTokenizer` loads and encodes alike) and its
        `tokenizer_config.json`. enwik8's byte ids have no `transformers`
        tokenizer (its model card encodes the bytes by hand)."""
        tokenizer = preprocessor.tokenizer
        if not isinstance(tokenizer, ReformerTokenizer):
            raise NotExportableError(
                f"transformers has no tokenizer for {type(tokenizer).__name__} (enwik8's byte ids); export with "
                "include_preprocessor=False and encode bytes as the model card does."
            )
        tokenizer.save(directory)
        write_tokenizer_config(
            directory, "ReformerTokenizer", eos_token=END_TOKEN, unk_token=UNKNOWN_TOKEN,
            model_max_length=preprocessor.sequence_length,
        )


register_converter(ReformerConverter())
