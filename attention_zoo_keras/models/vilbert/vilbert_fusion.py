"""How ViLBERT's heads join its two pooled outputs (Lu et al., 2019, §3.2;
the authors' `fusion_method`): the text summary `h_T` (the pooled [CLS]
token) and the image summary `h_V` (the pooled global region), both
`co_attention_dim` wide, become one vector

    h = h_T ⊙ h_V      "mul", the authors' default
    h = h_T + h_V      "sum"

that the alignment, VQA and retrieval heads read (after dropout, see
`layers.classification_head`).
"""

import keras

FUSIONS = ("mul", "sum")


def fuse_pooled_outputs(backbone_outputs, fusion, dtype, name):
    """The fused pooled vector of a `ViLBERTBackbone`'s outputs.

    Args:
        backbone_outputs: dict. The backbone's symbolic outputs.
        fusion: str. `"mul"` or `"sum"`.
        dtype: str or `keras.DTypePolicy`. The new layer's dtype policy.
        name: str. Prefix of the new layer's name, `{name}_fusion`.

    Returns:
        KerasTensor. `(batch, co_attention_dim)`.
    """
    if fusion not in FUSIONS:
        raise ValueError(f"Unknown fusion {fusion!r}; ViLBERT fuses its pooled outputs by one of {FUSIONS}.")
    pooled = [backbone_outputs["pooled_output"], backbone_outputs["visual_pooled_output"]]
    join = keras.layers.Multiply if fusion == "mul" else keras.layers.Add
    return join(dtype=dtype, name=f"{name}_fusion")(pooled)
