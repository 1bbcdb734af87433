"""How ViLBERT's heads join its two pooled outputs (Lu et al., 2019, §3.2;
the authors' `fusion_method`): the text summary `h_T` (the pooled [CLS]
token) and the image summary `h_V` (the pooled global region), both
`co_attention_dim` wide, become one vector

    h = Dropout(h_T ⊙ h_V)      "mul", the authors' default
    h = Dropout(h_T + h_V)      "sum"

that the alignment, VQA and retrieval heads read.
"""

import keras

FUSIONS = ("mul", "sum")


def fuse_pooled_outputs(backbone_outputs, fusion, dropout, dtype, name):
    """The fused, dropped-out pooled vector of a `ViLBERTBackbone`'s outputs.

    Args:
        backbone_outputs: the backbone's output dict (symbolic).
        fusion: `"mul"` or `"sum"`.
        dropout: dropout rate on the fused vector.
        dtype: dtype policy of the new layers.
        name: prefix of the new layers' names (`{name}_fusion`, `{name}_dropout`).

    Returns:
        `(batch, co_attention_dim)`.
    """
    if fusion not in FUSIONS:
        raise ValueError(f"Unknown fusion {fusion!r}; ViLBERT fuses its pooled outputs by one of {FUSIONS}.")
    pooled = [backbone_outputs["pooled_output"], backbone_outputs["visual_pooled_output"]]
    join = keras.layers.Multiply if fusion == "mul" else keras.layers.Add
    fused = join(dtype=dtype, name=f"{name}_fusion")(pooled)
    return keras.layers.Dropout(dropout, dtype=dtype, name=f"{name}_dropout")(fused)
