"""A stack of identically configured blocks, the `L` layers of a Transformer
encoder or decoder (Vaswani et al., 2017, §3.1):

    H_l = Block_l(H_{l−1}),   l = 1..L

Each block gets its own copy of the kernel initializer and the name
`{name}_{l−1}`, the names that weight paths, presets and checkpoint
converters rely on.
"""

from attention_zoo_keras.layers.initializers import clone_initializer


def block_stack(block_class, num_blocks, kernel_initializer, name="transformer_layer", **block_arguments):
    """`num_blocks` new blocks named `{name}_0`, `{name}_1`, ….

    Args:
        block_class: type. The block layer, e.g. `TransformerEncoderBlock`;
            it must take `kernel_initializer` and `name`.
        num_blocks: int. The number of blocks.
        kernel_initializer: str, dict or `keras.initializers.Initializer`.
            The kernels' initializer; each block gets its own copy.
        name: str. Prefix of the blocks' names.
        **block_arguments: dict. The blocks' other constructor arguments,
            the same for every block (`dtype` among them).

    Returns:
        list. The blocks, first to last.

    Example:

    >>> from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
    >>> blocks = block_stack(TransformerEncoderBlock, 2, "glorot_uniform", num_heads=2, intermediate_dim=8)
    >>> [block.name for block in blocks]
    ['transformer_layer_0', 'transformer_layer_1']
    """
    return [
        block_class(**block_arguments, kernel_initializer=clone_initializer(kernel_initializer), name=f"{name}_{index}")
        for index in range(num_blocks)
    ]
