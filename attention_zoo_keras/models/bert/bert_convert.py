"""Converts Hugging Face `transformers` BERT checkpoints (`BertModel`,
`BertForMaskedLM`, `BertForPreTraining`, `BertForSequenceClassification`,
with or without the `bert.` prefix) and sentence-transformers BERT repos.

torch `nn.Linear` stores weights as `(out, in)`; Keras `Dense` kernels are
`(in, out)`, so every linear weight is transposed.
"""

from attention_zoo_keras.hub.converters import TransformersConverter
from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import copy_layer_norm
from attention_zoo_keras.hub.converters import register_converter
from attention_zoo_keras.hub.transformers_export import write_tokenizer_config
from attention_zoo_keras.models.bert.bert_backbone import BertBackbone
from attention_zoo_keras.models.bert.bert_preprocessor import BertPreprocessor
from attention_zoo_keras.models.bert.bert_text_classifier import BertTextClassifier
from attention_zoo_keras.models.bert.bert_text_embedder import BertTextEmbedder
from attention_zoo_keras.models.bert.bert_tokenizer import SPECIAL_TOKENS
from attention_zoo_keras.models.bert.bert_tokenizer import BertTokenizer

POOLER_KEYS = frozenset({"pooler/kernel", "pooler/bias"})
SENTENCE_TRANSFORMERS_NORMALIZE = "sentence_transformers.models.Normalize"


def copy_bert_layer(arrays, ours, theirs, checkpoint):
    """A torch `BertLayer` `theirs` (self-attention, its output dense and
    LayerNorm, intermediate and output dense and LayerNorm) onto the
    post-norm `TransformerEncoderBlock` `ours`."""
    for projection in ("query", "key", "value"):
        copy_dense(arrays, f"{ours}/self_attention/{projection}", f"{theirs}.attention.self.{projection}", checkpoint)
    copy_dense(arrays, f"{ours}/self_attention/output", f"{theirs}.attention.output.dense", checkpoint)
    copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.attention.output.LayerNorm", checkpoint)
    copy_dense(arrays, f"{ours}/feed_forward/intermediate", f"{theirs}.intermediate.dense", checkpoint)
    copy_dense(arrays, f"{ours}/feed_forward/output", f"{theirs}.output.dense", checkpoint)
    copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.output.LayerNorm", checkpoint)


class BertConverter(TransformersConverter):
    model_type = "bert"
    backbone_cls = BertBackbone
    preprocessor_cls = BertPreprocessor
    optional_keys = POOLER_KEYS
    # `position_ids` buffers; `BertForPreTraining`'s next-sentence head; the
    # masked-LM decoder, tied to the token embedding (and its bias to
    # `cls.predictions.bias`, which is read where a checkpoint has both).
    ignored_source_keys = (
        r".*position_ids", r"cls\.seq_relationship\..*", r"cls\.predictions\.decoder\.(weight|bias)",
    )
    head_keys = (r"mlm_head/.*", r"classifier/.*")
    checkpoint_sizes = {
        "vocabulary_size": ("token_embedding/embeddings", 0),
        "hidden_dim": ("token_embedding/embeddings", 1),
        "max_sequence_length": ("position_embedding/embeddings", 0),
        "num_segments": ("segment_embedding/embeddings", 0),
        "intermediate_dim": ("transformer_layer_0/feed_forward/intermediate/kernel", 1),
    }

    def backbone_config(self, hf_config):
        if hf_config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                "Only BERT checkpoints with absolute position embeddings can be converted; "
                f"this one uses '{hf_config['position_embedding_type']}'."
            )
        return {
            "vocabulary_size": hf_config["vocab_size"],
            "num_layers": hf_config["num_hidden_layers"],
            "num_heads": hf_config["num_attention_heads"],
            "hidden_dim": hf_config["hidden_size"],
            "intermediate_dim": hf_config["intermediate_size"],
            "dropout": hf_config.get("hidden_dropout_prob", 0.1),
            "attention_dropout": hf_config.get("attention_probs_dropout_prob", 0.1),
            "max_sequence_length": hf_config.get("max_position_embeddings", 512),
            "num_segments": hf_config.get("type_vocab_size", 2),
            "activation": hf_config.get("hidden_act", "gelu"),
            "layer_norm_epsilon": hf_config.get("layer_norm_eps", 1e-12),
            "initializer_range": hf_config.get("initializer_range", 0.02),
        }

    def weights(self, hf_config, checkpoint):
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in checkpoint else ""
        if f"{prefix}embeddings.word_embeddings.weight" not in checkpoint:
            raise ValueError(
                "This checkpoint has no 'embeddings.word_embeddings.weight' (with or without "
                "the 'bert.' prefix); it is not a BERT checkpoint."
            )
        arrays = {}
        embeddings = f"{prefix}embeddings"
        arrays["token_embedding/embeddings"] = checkpoint[f"{embeddings}.word_embeddings.weight"]
        arrays["position_embedding/embeddings"] = checkpoint[f"{embeddings}.position_embeddings.weight"]
        arrays["segment_embedding/embeddings"] = checkpoint[f"{embeddings}.token_type_embeddings.weight"]
        copy_layer_norm(arrays, "embeddings_norm", f"{embeddings}.LayerNorm", checkpoint)
        for index in range(hf_config["num_hidden_layers"]):
            theirs = f"{prefix}encoder.layer.{index}"
            ours = f"transformer_layer_{index}"
            copy_bert_layer(arrays, ours, theirs, checkpoint)
        if f"{prefix}pooler.dense.weight" in checkpoint:
            copy_dense(arrays, "pooler", f"{prefix}pooler.dense", checkpoint)
        if "cls.predictions.transform.dense.weight" in checkpoint:
            copy_dense(arrays, "mlm_head/transform", "cls.predictions.transform.dense", checkpoint)
            copy_layer_norm(arrays, "mlm_head/transform_norm", "cls.predictions.transform.LayerNorm", checkpoint)
            bias = "cls.predictions.bias" if "cls.predictions.bias" in checkpoint else "cls.predictions.decoder.bias"
            arrays["mlm_head/output_bias"] = checkpoint[bias]
        if "classifier.weight" in checkpoint:
            copy_dense(arrays, "classifier", "classifier", checkpoint)
        return arrays

    def task_config(self, task_cls, source, hf_config):
        if issubclass(task_cls, BertTextClassifier):
            if "BertForSequenceClassification" in hf_config.get("architectures", []):
                labels = hf_config.get("id2label")
                return {"num_classes": hf_config.get("num_labels", len(labels) if labels else 2)}
            return {}
        if issubclass(task_cls, BertTextEmbedder):
            return self._sentence_transformers_settings(source)
        return {}

    @staticmethod
    def _sentence_transformers_settings(source):
        """Pooling and normalisation from a sentence-transformers repo."""
        modules = source.json("modules.json", required=False)
        if not modules:
            return {}
        settings = {"normalize": any(m.get("type") == SENTENCE_TRANSFORMERS_NORMALIZE for m in modules)}
        pooling_module = next((m for m in modules if m.get("type", "").endswith(".Pooling")), None)
        if pooling_module is not None:
            pooling = source.json(f"{pooling_module['path']}/config.json", required=False) or {}
            if pooling.get("pooling_mode_cls_token"):
                settings["pooling"] = "cls"
            elif pooling.get("pooling_mode_mean_tokens", True):
                settings["pooling"] = "mean"
        return settings

    def tokenizer(self, source, hf_config):
        tokenizer_json = source.file("tokenizer.json")
        if tokenizer_json is not None:
            return BertTokenizer.from_file(tokenizer_json)
        vocabulary = source.require("vocab.txt")
        settings = source.json("tokenizer_config.json", required=False) or {}
        return BertTokenizer.from_vocabulary(
            vocabulary,
            lowercase=settings.get("do_lower_case", True),
            strip_accents=settings.get("strip_accents"),
        )

    def preprocessor_config(self, source, hf_config):
        length = hf_config.get("max_position_embeddings", 512)
        sentence_config = source.json("sentence_bert_config.json", required=False) or {}
        if sentence_config.get("max_seq_length"):
            length = min(length, sentence_config["max_seq_length"])
        return {"sequence_length": length}

    # `BertTextEmbedder` is not exported: its pooling and normalisation are
    # sentence-transformers' files, not a `transformers` architecture.
    transformers_architectures = {
        "BertBackbone": "BertModel",
        "BertMaskedLM": "BertForMaskedLM",
        "BertTextClassifier": "BertForSequenceClassification",
    }

    transformers_names = {
        "vocabulary_size": "vocab_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
        "hidden_dim": "hidden_size", "intermediate_dim": "intermediate_size", "dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob", "max_sequence_length": "max_position_embeddings",
        "num_segments": "type_vocab_size", "activation": "hidden_act", "layer_norm_epsilon": "layer_norm_eps",
        "initializer_range": "initializer_range",
    }

    def transformers_config(self, model):
        hf_config = super().transformers_config(model)
        if isinstance(model, BertTextClassifier):
            hf_config["num_labels"] = model.num_classes
        return hf_config

    def export_preprocessor(self, preprocessor, directory):
        tokenizer = preprocessor.tokenizer
        pad, unk, cls, sep, mask = SPECIAL_TOKENS
        tokenizer.save(directory)  # tokenizer.json, which transformers reads
        write_tokenizer_config(
            directory, "BertTokenizer",
            do_lower_case=tokenizer.normalizer_settings["lowercase"],
            strip_accents=tokenizer.normalizer_settings["strip_accents"],
            pad_token=pad, unk_token=unk, cls_token=cls, sep_token=sep, mask_token=mask,
            model_max_length=preprocessor.sequence_length,
        )


register_converter(BertConverter())
