"""Converts Hugging Face `transformers` Transformer-XL checkpoints
(`TransfoXLLMHeadModel`, `model_type` "transfo-xl"; the model was removed
from `transformers` in 5.0, its checkpoints remain on the Hub).

Layout of their tensors, and where they go:

- `transformer.word_emb.emb_layers.{i}.weight` `(|V_i|, d_i)` → the adaptive
  input tables; `emb_projs.{i}` `(d_model, d_i)`, applied as `e Pᵀ`, → the
  input projections, transposed.
- `transformer.layers.{l}.dec_attn.qkv_net.weight` `(3·N·H, d_model)`: the
  query, key and value projections stacked in that order (no biases);
  `r_net` the position projection W_R; `o_net` the output; `r_w_bias` is
  the content bias u and `r_r_bias` the position bias v (per layer with
  `untie_r`, else once as `transformer.r_w_bias` / `r_r_bias`).
- `pos_ff.CoreNet.0` / `.3` the feed-forward layers, `pos_ff.layer_norm`
  and `dec_attn.layer_norm` the two norms.
- `crit.*` the adaptive softmax: `cluster_weight`, `cluster_bias`,
  `out_layers.{i}.bias`, and the projections `out_projs.{i}` `(d_model,
  d_i)`, applied as `h P` (already a Keras kernel). Tied tensors
  (`out_layers.{i}.weight`, and `out_projs.{i}` where `tie_projs[i]`) are
  stored once, as the embedding's, and are not read.
"""

import numpy as np

from attention_zoo_keras.hub.converters import TransformersConverter
from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import copy_layer_norm
from attention_zoo_keras.hub.converters import register_converter
from attention_zoo_keras.layers.adaptive_embedding import cluster_bounds
from attention_zoo_keras.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from attention_zoo_keras.models.transformer_xl.transformer_xl_causal_lm import TransformerXLCausalLM
from attention_zoo_keras.models.transformer_xl.transformer_xl_causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from attention_zoo_keras.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer

VOCABULARY_FILES = ("vocab.pkl", "vocab.bin")


def _check_supported(hf_config):
    problems = []
    if hf_config.get("attn_type", 0) != 0:
        problems.append(f"'attn_type' is {hf_config['attn_type']} (only 0, the paper's relative attention, exists)")
    if hf_config.get("sample_softmax", -1) > 0:
        problems.append("'sample_softmax' is set (a sampled softmax for training)")
    if hf_config.get("mem_len", 1600) < 1:
        problems.append("'mem_len' is 0 (no memory)")
    if problems:
        raise ValueError("This Transformer-XL checkpoint cannot be converted: " + "; ".join(problems) + ".")


def _tie_projections(hf_config):
    cutoffs = hf_config.get("cutoffs", [20000, 40000, 200000])
    tie = hf_config.get("tie_projs", [False] + [True] * len(cutoffs))
    return [bool(t) for t in tie][: len(cutoffs) + 1]


def _table_shapes(config):
    """`(rows, width)` of each adaptive table (`emb_layers`, `out_layers`):
    one over the whole vocabulary when `div_val` is 1, else one per cluster,
    `embedding_dim / div_val**i` wide."""
    if config["div_val"] == 1:
        return [(config["vocabulary_size"], config["embedding_dim"])]
    bounds = cluster_bounds(config["vocabulary_size"], config["cutoffs"])
    return [(stop - start, config["embedding_dim"] // config["div_val"] ** i) for i, (start, stop) in enumerate(bounds)]


def _has_projections(config):
    """Whether the tables are projected to `hidden_dim` (`emb_projs`,
    `out_projs`)."""
    return config["div_val"] > 1 or config["embedding_dim"] != config["hidden_dim"]


def _output_projection_widths(config):
    """The width of each softmax projection (`out_projs.{i}`): one per
    cluster, even when `div_val` is 1 and one table serves them all."""
    widths = [width for _, width in _table_shapes(config)]
    return widths * (len(config["cutoffs"]) + 1) if config["div_val"] == 1 else widths


class TransformerXLConverter(TransformersConverter):
    model_type = "transfo-xl"
    backbone_cls = TransformerXLBackbone
    preprocessor_cls = TransformerXLCausalLMPreprocessor
    # The sinusoid's inverse frequencies, a buffer that is computed.
    ignored_source_keys = (r"(transformer\.)?pos_emb\.inv_freq",)
    head_keys = (r"lm_head/.*",)

    def backbone_config(self, hf_config):
        _check_supported(hf_config)
        d_model = hf_config.get("d_model", 1024)
        return {
            "vocabulary_size": hf_config.get("vocab_size", 267735),
            "num_layers": hf_config.get("n_layer", 18),
            "num_heads": hf_config.get("n_head", 16),
            "hidden_dim": d_model,
            "head_dim": hf_config.get("d_head", 64),
            "intermediate_dim": hf_config.get("d_inner", 4096),
            "mem_len": hf_config.get("mem_len", 1600),
            "embedding_dim": hf_config.get("d_embed", d_model),
            "cutoffs": list(hf_config.get("cutoffs", [20000, 40000, 200000])),
            "div_val": hf_config.get("div_val", 4),
            "clamp_len": max(hf_config.get("clamp_len", 1000), 0),
            "same_length": hf_config.get("same_length", True),
            "per_layer_biases": hf_config.get("untie_r", True),
            "norm_first": hf_config.get("pre_lnorm", False),
            "dropout": hf_config.get("dropout", 0.1),
            "attention_dropout": hf_config.get("dropatt", 0.0),
            "layer_norm_epsilon": hf_config.get("layer_norm_epsilon", 1e-5),
            "initializer_range": hf_config.get("init_std", 0.02),
            "projection_initializer_range": hf_config.get("proj_init_std", 0.01),
        }

    def task_config(self, task_cls, source, hf_config):
        if not issubclass(task_cls, TransformerXLCausalLM):
            return {}
        return {
            "tie_embeddings": hf_config.get("tie_word_embeddings", True),
            "tie_projections": _tie_projections(hf_config),
        }

    def weights(self, hf_config, checkpoint):
        config = self.backbone_config(hf_config)
        if "transformer.word_emb.emb_layers.0.weight" not in checkpoint:
            raise ValueError(
                "This checkpoint has no 'transformer.word_emb.emb_layers.0.weight'; it is not a "
                "TransfoXLLMHeadModel checkpoint."
            )
        arrays = {}
        for i in range(len(_table_shapes(config))):
            arrays[f"token_embedding/embeddings_{i}"] = checkpoint[f"transformer.word_emb.emb_layers.{i}.weight"]
            if _has_projections(config):
                arrays[f"token_embedding/projection_{i}"] = np.asarray(checkpoint[f"transformer.word_emb.emb_projs.{i}"]).T
        if not config["per_layer_biases"]:
            arrays["shared_biases/content_bias"] = checkpoint["transformer.r_w_bias"]
            arrays["shared_biases/position_bias"] = checkpoint["transformer.r_r_bias"]
        for index in range(config["num_layers"]):
            theirs = f"transformer.layers.{index}"
            ours = f"transformer_layer_{index}"
            qkv = np.asarray(checkpoint[f"{theirs}.dec_attn.qkv_net.weight"])
            for name, weight in zip(("query", "key", "value"), np.split(qkv, 3, axis=0)):
                arrays[f"{ours}/self_attention/{name}/kernel"] = weight.T
            arrays[f"{ours}/self_attention/output/kernel"] = np.asarray(checkpoint[f"{theirs}.dec_attn.o_net.weight"]).T
            arrays[f"{ours}/position_projection/kernel"] = np.asarray(checkpoint[f"{theirs}.dec_attn.r_net.weight"]).T
            if config["per_layer_biases"]:
                arrays[f"{ours}/self_attention/content_bias"] = checkpoint[f"{theirs}.dec_attn.r_w_bias"]
                arrays[f"{ours}/self_attention/position_bias"] = checkpoint[f"{theirs}.dec_attn.r_r_bias"]
            copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.dec_attn.layer_norm", checkpoint)
            copy_dense(arrays, f"{ours}/feed_forward/intermediate", f"{theirs}.pos_ff.CoreNet.0", checkpoint)
            copy_dense(arrays, f"{ours}/feed_forward/output", f"{theirs}.pos_ff.CoreNet.3", checkpoint)
            copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.pos_ff.layer_norm", checkpoint)
        self._softmax_weights(arrays, hf_config, config, checkpoint)
        return arrays

    def _softmax_weights(self, arrays, hf_config, config, checkpoint):
        """The adaptive softmax's own tensors (`crit.*`), if the checkpoint
        has the LM head."""
        if "crit.out_layers.0.bias" not in checkpoint:
            return
        if config["cutoffs"]:
            arrays["lm_head/cluster_weight"] = checkpoint["crit.cluster_weight"]
            arrays["lm_head/cluster_bias"] = checkpoint["crit.cluster_bias"]
        num_tables = len(_table_shapes(config))
        for i in range(num_tables):
            arrays[f"lm_head/output_bias_{i}"] = checkpoint[f"crit.out_layers.{i}.bias"]
        tied_tables = hf_config.get("tie_word_embeddings", True)
        if not tied_tables:
            for i in range(num_tables):
                arrays[f"lm_head/output_embeddings_{i}"] = checkpoint[f"crit.out_layers.{i}.weight"]
        if _has_projections(config):
            for i, tied in enumerate(self._tied_output_projections(hf_config)):
                if not tied:
                    arrays[f"lm_head/projection_{i}"] = checkpoint[f"crit.out_projs.{i}"]

    @staticmethod
    def _tied_output_projections(hf_config):
        """Per cluster, whether its softmax projection is the input
        projection's (stored once, under the embedding's name)."""
        if hf_config.get("tie_word_embeddings", True):
            return _tie_projections(hf_config)
        return [False] * (len(hf_config.get("cutoffs", [20000, 40000, 200000])) + 1)

    def tokenizer(self, source, hf_config):
        tokenizer_json = source.file("tokenizer.json")
        if tokenizer_json is not None:
            return TransformerXLTokenizer.from_file(tokenizer_json)
        for filename in VOCABULARY_FILES:
            path = source.file(filename)
            if path is not None:
                return TransformerXLTokenizer.from_vocabulary_file(path)
        raise FileNotFoundError(
            f"Preset '{source.description}' has no Transformer-XL vocabulary: none of tokenizer.json, "
            f"{', '.join(VOCABULARY_FILES)}."
        )

    def preprocessor_config(self, source, hf_config):
        return {"sequence_length": hf_config.get("tgt_len", 128)}

    transformers_architectures = {
        "TransformerXLBackbone": "TransfoXLModel",
        "TransformerXLCausalLM": "TransfoXLLMHeadModel",
    }

    transformers_names = {
        "vocabulary_size": "vocab_size", "num_layers": "n_layer", "num_heads": "n_head", "hidden_dim": "d_model",
        "head_dim": "d_head", "intermediate_dim": "d_inner", "mem_len": "mem_len", "embedding_dim": "d_embed",
        "cutoffs": "cutoffs", "div_val": "div_val", "clamp_len": "clamp_len", "same_length": "same_length",
        "per_layer_biases": "untie_r", "norm_first": "pre_lnorm", "dropout": "dropout",
        "attention_dropout": "dropatt", "layer_norm_epsilon": "layer_norm_epsilon",
        "initializer_range": "init_std", "projection_initializer_range": "proj_init_std",
    }

    def transformers_config(self, model):
        hf_config = {**super().transformers_config(model), "adaptive": True, "attn_type": 0}
        if hasattr(model, "backbone"):
            hf_config["tie_word_embeddings"] = model.tie_embeddings
            hf_config["tie_projs"] = list(model.tie_projections)
        preprocessor = getattr(model, "preprocessor", None)
        if preprocessor is not None:
            hf_config["tgt_len"] = preprocessor.sequence_length
        return hf_config

    def transformers_shapes(self, hf_config):
        """The tensors `TransfoXLModel` / `TransfoXLLMHeadModel` of
        `transformers` 4.x save (the classes are gone from 5.0), each tied
        tensor once, under the embedding's name."""
        config = self.backbone_config(hf_config)
        d_model, d_embed = config["hidden_dim"], config["embedding_dim"]
        heads = (config["num_heads"], config["head_dim"])
        tables = _table_shapes(config)
        shapes = {}
        for i, (rows, width) in enumerate(tables):
            shapes[f"transformer.word_emb.emb_layers.{i}.weight"] = (rows, width)
            if _has_projections(config):
                shapes[f"transformer.word_emb.emb_projs.{i}"] = (d_model, width)
        if not config["per_layer_biases"]:
            shapes["transformer.r_w_bias"] = shapes["transformer.r_r_bias"] = heads
        width, inner = config["num_heads"] * config["head_dim"], config["intermediate_dim"]
        for index in range(config["num_layers"]):
            layer = f"transformer.layers.{index}"
            shapes[f"{layer}.dec_attn.qkv_net.weight"] = (3 * width, d_model)
            shapes[f"{layer}.dec_attn.o_net.weight"] = (d_model, width)
            shapes[f"{layer}.dec_attn.r_net.weight"] = (width, d_model)
            if config["per_layer_biases"]:
                shapes[f"{layer}.dec_attn.r_w_bias"] = shapes[f"{layer}.dec_attn.r_r_bias"] = heads
            shapes[f"{layer}.pos_ff.CoreNet.0.weight"] = (inner, d_model)
            shapes[f"{layer}.pos_ff.CoreNet.0.bias"] = (inner,)
            shapes[f"{layer}.pos_ff.CoreNet.3.weight"] = (d_model, inner)
            shapes[f"{layer}.pos_ff.CoreNet.3.bias"] = (d_model,)
            for norm in ("dec_attn.layer_norm", "pos_ff.layer_norm"):
                shapes[f"{layer}.{norm}.weight"] = shapes[f"{layer}.{norm}.bias"] = (d_model,)
        if hf_config["architectures"] == ["TransfoXLLMHeadModel"]:
            if config["cutoffs"]:
                shapes["crit.cluster_weight"] = (len(config["cutoffs"]), d_embed)
                shapes["crit.cluster_bias"] = (len(config["cutoffs"]),)
            for i, (rows, width) in enumerate(tables):
                shapes[f"crit.out_layers.{i}.bias"] = (rows,)
                if not hf_config.get("tie_word_embeddings", True):
                    shapes[f"crit.out_layers.{i}.weight"] = (rows, width)
            if _has_projections(config):
                tied = self._tied_output_projections(hf_config)
                for i, width in enumerate(_output_projection_widths(config)):
                    if not tied[i]:
                        shapes[f"crit.out_projs.{i}"] = (d_model, width)
        return shapes


register_converter(TransformerXLConverter())
