"""The independent reference of the linear-attention GPT verifier: causal
linear attention (Katharopoulos, Vyas, Pappas and Fleuret, 2020, "Transformers
are RNNs", eqs. 4-7 and 9) written in torch from the paper, without
attention_zoo_keras,

    V'_i = φ(Q_i)ᵀ Σ_{j≤i} φ(K_j) V_jᵀ / (φ(Q_i)ᵀ Σ_{j≤i} φ(K_j) + eps),   φ(x) = elu(x) + 1,

and plugged into transformers' attention function interface, so that
transformers' GPT-2 runs it in place of softmax attention.
"""

LINEAR_ATTENTION_EPS = 1e-6  # the authors' code (fast-transformers): added once to the denominator
LINEAR_REFERENCE = "linear_attention_katharopoulos2020"  # its name in transformers' AttentionInterface


def causal_linear_attention_reference(query, key, value, eps=LINEAR_ATTENTION_EPS, attention_mask=None):
    """Causal linear attention, as the module states it, in torch: no 1/√d
    scaling and `eps` added once, after the dot product φ(Q_i)ᵀz (as in the
    authors' `fast-transformers`). Computed in the masked O(L²) form
    Σ_j A_ij V_j / (Σ_j A_ij + eps), A_ij = φ(Q_i)ᵀφ(K_j)·[j ≤ i]·mask_ij, in
    float64, and returned in the query's dtype.

    Args:
        query: torch.Tensor. `(batch, heads, length, key_dim)`.
        key: torch.Tensor. `(batch, heads, length, key_dim)`.
        value: torch.Tensor. `(batch, heads, length, value_dim)`.
        eps: float. Added to the denominator.
        attention_mask: torch.Tensor or None. Broadcastable to `(batch,
            heads, length, length)`: boolean (`True` where query i may see
            key j) or additive float (0 where it may); combined with the
            causal mask.

    Returns:
        `(batch, heads, length, value_dim)`.
    """
    import torch

    length = query.shape[-2]
    phi_query = torch.nn.functional.elu(query.double()) + 1
    phi_key = torch.nn.functional.elu(key.double()) + 1
    keep = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    if attention_mask is not None:
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        keep = keep & mask[..., -length:, -length:]
    similarity = (phi_query @ phi_key.transpose(-1, -2)) * keep  # A_ij = φ(Q_i)ᵀφ(K_j), j ≤ i
    numerator = similarity @ value.double()  # φ(Q_i)ᵀ Σ_{j≤i} φ(K_j)V_jᵀ
    denominator = similarity.sum(dim=-1, keepdim=True) + eps  # φ(Q_i)ᵀ Σ_{j≤i} φ(K_j) + eps
    return (numerator / denominator).to(query.dtype)


def _linear_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """`causal_linear_attention_reference` behind transformers' attention
    function interface: `(batch, heads, length, dim)` in, `(batch, length,
    heads, dim)` out, no attention weights. `scaling` (GPT-2's 1/√d) is not
    used: the paper has none."""
    del module, scaling, kwargs
    if dropout:
        raise ValueError("linear attention has no attention dropout; run the reference in eval mode")
    output = causal_linear_attention_reference(query, key, value, attention_mask=attention_mask)
    return output.transpose(1, 2).contiguous(), None


def register_linear_reference(transformers):
    """Registers the linear attention (and, for its padding mask, the boolean
    `sdpa` mask) under `LINEAR_REFERENCE` in transformers' interfaces.

    Args:
        transformers: module. The imported `transformers` package.

    Returns:
        The name to pass as `attn_implementation`.
    """
    from transformers.masking_utils import sdpa_mask

    transformers.AttentionInterface.register(LINEAR_REFERENCE, _linear_attention_forward)
    transformers.AttentionMaskInterface.register(LINEAR_REFERENCE, sdpa_mask)
    return LINEAR_REFERENCE
