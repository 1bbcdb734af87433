"""Drawing attention maps (matplotlib, an optional dependency:
`pip install attention_zoo_keras[plot]`)."""

import numpy as np


def plot_attention(probabilities, query_labels=None, key_labels=None, heads=None, title=None, head_size=3.0):
    """Heads side by side: one heat map per head, the queries down and the
    keys across, with tokens or patch numbers on the axes, on one colour
    scale from 0 to the largest weight drawn.

    Args:
        probabilities: array of shape `(heads, queries, keys)` or
            `(queries, keys)`. One example of what `layers.attention_maps`
            returns.
        query_labels: sequence or None. A label per query (tokens, patch
            numbers); `None`: positions.
        key_labels: sequence or None. A label per key; `None`:
            `query_labels` when the lengths agree (self-attention).
        heads: sequence of int or None. The indices of the heads to draw
            (`None`: all).
        title: str or None. The figure's title.
        head_size: float. Inches per head.

    Returns:
        The `matplotlib.figure.Figure`.

    Raises:
        ImportError: without matplotlib, saying how to install it.
        ValueError: for probabilities of another rank, or labels whose
            number does not match the queries / keys.

    Example:

    >>> import numpy as np
    >>> figure = plot_attention(np.full((2, 3, 3), 1 / 3), query_labels=["a", "b", "c"])
    >>> [axis.get_title() for axis in figure.axes]
    ['head 0', 'head 1']
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "plot_attention needs matplotlib: pip install matplotlib (or attention_zoo_keras[plot])."
        ) from error
    probabilities = np.asarray(probabilities, dtype="float32")
    one_map = probabilities.ndim == 2  # drawn without a head's title
    if one_map:
        probabilities = probabilities[None]
    if probabilities.ndim != 3:
        raise ValueError(
            f"probabilities must be (heads, queries, keys) or (queries, keys); got shape {probabilities.shape}. "
            "Pick one example of attention_maps' (batch, heads, queries, keys) arrays, e.g. maps[name][0]."
        )
    num_queries, num_keys = probabilities.shape[1:]
    if key_labels is None and query_labels is not None and len(query_labels) == num_keys:
        key_labels = query_labels
    for labels, count, what in ((query_labels, num_queries, "queries"), (key_labels, num_keys, "keys")):
        if labels is not None and len(labels) != count:
            raise ValueError(f"{len(labels)} labels for {count} {what}.")
    heads = list(range(probabilities.shape[0])) if heads is None else list(heads)
    largest = float(probabilities[heads].max()) or 1.0  # one colour scale for all heads drawn
    figure, axes = plt.subplots(1, len(heads), figsize=(head_size * len(heads), head_size), squeeze=False)
    for axis, head in zip(axes[0], heads):
        axis.imshow(probabilities[head], vmin=0.0, vmax=largest, cmap="viridis", aspect="auto")
        if not one_map:
            axis.set_title(f"head {head}")
        axis.set_xlabel("key")
        axis.set_ylabel("query")
        if key_labels is not None:
            axis.set_xticks(range(num_keys), [str(label) for label in key_labels], rotation=90)
        if query_labels is not None:
            axis.set_yticks(range(num_queries), [str(label) for label in query_labels])
    if title is not None:
        figure.suptitle(title)
    figure.tight_layout()
    return figure
