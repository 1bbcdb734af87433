"""The matrix `E` of a `keras.layers.Embedding` as the layer itself looks
rows up in it, for heads tied to it (`logits = H Eᵀ`, Press & Wolf, 2017).

A plain embedding's `E` is its `embeddings` property (with any LoRA update,
`E + (α/r) A B`, already added by Keras). A quantized one stores integers
and per-row scales (int8: `E ≈ E_q / s`; int4 also packs two values a
byte, per channel or per block); reading its `embeddings` would hand the
raw integers to the head. Its `E` is then the layer's own lookup of every
row, so Keras' dequantization, whatever the mode, is the only one there is.
"""

from keras import ops


def embedding_matrix(embedding, dtype):
    """`E` `(input_dim, output_dim)` of `embedding`, dequantized, in `dtype`.

    Example:

    >>> import keras
    >>> embedding = keras.layers.Embedding(10, 4)
    >>> embedding.build((None,))
    >>> embedding.quantize("int8")
    >>> tuple(embedding_matrix(embedding, "float32").shape)
    (10, 4)
    """
    if embedding.quantization_mode is None:
        return ops.cast(embedding.embeddings, dtype)
    return ops.cast(embedding(ops.arange(embedding.input_dim, dtype="int32")), dtype)
