"""Weights of a `torch.nn.Transformer` as a `TransformerBackbone`'s.

`torch.nn.Transformer` holds the two stacks only: each block's attention
keeps its query, key and value projections fused in `in_proj_weight`
`(3·d, d)` (rows: query, then key, then value), `nn.Linear` weights are
`(out, in)` and are transposed into Keras kernels, and each stack ends in a
layer norm (`encoder.norm`, `decoder.norm`) whether its blocks are post-norm
or pre-norm. Token embeddings and positions live outside it, in the user's
module, so their arrays are passed in separately.
"""

import numpy as np

from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import copy_layer_norm


def _copy_attention(arrays, ours, theirs, state):
    weight = np.asarray(state[f"{theirs}.in_proj_weight"])
    bias = np.asarray(state[f"{theirs}.in_proj_bias"])
    for name, w, b in zip(("query", "key", "value"), np.split(weight, 3), np.split(bias, 3)):
        arrays[f"{ours}/{name}/kernel"] = w.T
        arrays[f"{ours}/{name}/bias"] = b
    copy_dense(arrays, f"{ours}/output", f"{theirs}.out_proj", state)


def _copy_feed_forward(arrays, ours, theirs, state):
    copy_dense(arrays, f"{ours}/feed_forward/intermediate", f"{theirs}.linear1", state)
    copy_dense(arrays, f"{ours}/feed_forward/output", f"{theirs}.linear2", state)


def torch_transformer_arrays(state_dict, prefix="", token_embedding=None, target_token_embedding=None):
    """`{variable key: array}` of a `TransformerBackbone` from the
    `state_dict()` of a `torch.nn.Transformer` (tensors or arrays).

    The backbone must be built with the transformer's sizes and
    `final_norm=True`, `norm_first`, `activation` and `layer_norm_epsilon`
    as the torch module has them; positions are not weights unless learned.

    Args:
        state_dict: dict. The module's state dict (or a larger one, see
            `prefix`).
        prefix: str. The transformer's prefix in `state_dict`, e.g.
            `"transformer."` for a model that holds it as `self.transformer`.
        token_embedding: array of shape `(vocabulary, d)` or None. The
            (shared or source) token embedding.
        target_token_embedding: array of shape `(target vocabulary, d)` or
            None. The target side's own embedding, when it has one.

    Returns:
        The arrays, for `backbone.assign_arrays(arrays, description)`.

    Example:

    >>> import torch
    >>> module = torch.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
    ...                               dim_feedforward=16, batch_first=True)
    >>> arrays = torch_transformer_arrays(module.state_dict())
    >>> arrays["decoder_layer_0/cross_attention/key/kernel"].shape
    (8, 8)
    """
    state = {
        key[len(prefix):]: value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        for key, value in state_dict.items()
        if key.startswith(prefix)
    }
    if "encoder.norm.weight" not in state:
        raise ValueError(
            f"The state dict has no '{prefix}encoder.norm.weight': it is not a torch.nn.Transformer "
            f"under the prefix '{prefix}'."
        )
    arrays = {}
    index = 0
    while f"encoder.layers.{index}.self_attn.in_proj_weight" in state:
        theirs, ours = f"encoder.layers.{index}", f"encoder_layer_{index}"
        _copy_attention(arrays, f"{ours}/self_attention", f"{theirs}.self_attn", state)
        copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.norm1", state)
        _copy_feed_forward(arrays, ours, theirs, state)
        copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.norm2", state)
        index += 1
    index = 0
    while f"decoder.layers.{index}.self_attn.in_proj_weight" in state:
        theirs, ours = f"decoder.layers.{index}", f"decoder_layer_{index}"
        _copy_attention(arrays, f"{ours}/self_attention", f"{theirs}.self_attn", state)
        copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.norm1", state)
        _copy_attention(arrays, f"{ours}/cross_attention", f"{theirs}.multihead_attn", state)
        copy_layer_norm(arrays, f"{ours}/cross_attention_norm", f"{theirs}.norm2", state)
        _copy_feed_forward(arrays, ours, theirs, state)
        copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.norm3", state)
        index += 1
    copy_layer_norm(arrays, "encoder_final_norm", "encoder.norm", state)
    copy_layer_norm(arrays, "decoder_final_norm", "decoder.norm", state)
    if token_embedding is not None:
        arrays["token_embedding/embeddings"] = np.asarray(token_embedding)
    if target_token_embedding is not None:
        arrays["target_token_embedding/embeddings"] = np.asarray(target_token_embedding)
    return arrays
