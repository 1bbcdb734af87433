"""ViLBERT's co-attention schedule (Lu et al., 2019, "ViLBERT: Pretraining
Task-Agnostic Visiolinguistic Representations for Vision-and-Language
Tasks", §3.1; the authors' `t_biattention_id` and `v_biattention_id`): where
the co-attention layers sit between the two streams' single-stream layers.

    for i = 1..K:
        T ← text layers   (text_layers[i-1] − 1 .. end)
        V ← visual layers (visual_layers[i-1] − 1 .. end)
        T, V ← CoAttention_i(T, V)
    T ← the remaining text layers;  V ← the remaining visual layers

`text_layers[i]` and `visual_layers[i]` are cumulative counts: how many of
the stream's layers have run before co-attention layer `i`.
"""


def check_co_attention_schedule(co_attention_text_layers, co_attention_visual_layers, num_layers, visual_num_layers):
    """Raises unless both schedules are equally long, non-decreasing and
    within the streams' numbers of layers.

    Args:
        co_attention_text_layers: list of int. Text layers run before each
            co-attention layer.
        co_attention_visual_layers: list of int. Visual layers run before
            each co-attention layer.
        num_layers: int. The text stream's layers.
        visual_num_layers: int. The visual stream's layers.

    Raises:
        ValueError: for schedules of different lengths, decreasing counts
            or counts beyond the stream's layers.
    """
    text, visual = list(co_attention_text_layers), list(co_attention_visual_layers)
    if len(text) != len(visual):
        raise ValueError(
            "co_attention_text_layers and co_attention_visual_layers must be equally long (one entry "
            f"per co-attention layer); got {text} and {visual}."
        )
    for name, schedule, total in (
        ("co_attention_text_layers", text, num_layers),
        ("co_attention_visual_layers", visual, visual_num_layers),
    ):
        if any(b < a for a, b in zip(schedule, schedule[1:])) or any(not 0 <= s <= total for s in schedule):
            raise ValueError(
                f"{name} must be non-decreasing layer counts between 0 and {total}; got {schedule}."
            )


def run_co_attention_schedule(text, visual, text_mask, visual_mask, blocks, co_attention_layers):
    """Both streams through their single-stream and co-attention layers.

    Args:
        text: tensor of shape `(batch, length, hidden_dim)`. The text stream.
        visual: tensor of shape `(batch, regions, visual_hidden_dim)`. The
            visual stream.
        text_mask: bool tensor of shape `(batch, 1, length)`. The attention
            mask over tokens.
        visual_mask: bool tensor of shape `(batch, 1, regions)`. The
            attention mask over regions.
        blocks: tuple. `(text_blocks, visual_blocks, co_attention_blocks)`,
            each a list of layers.
        co_attention_layers: tuple. `(co_attention_text_layers,
            co_attention_visual_layers)`, the cumulative counts of the schedule.

    Returns:
        tuple. The final `(text, visual)` streams.
    """
    text_blocks, visual_blocks, co_attention_blocks = blocks
    text_start = visual_start = 0
    for text_end, visual_end, co_attention in zip(*co_attention_layers, co_attention_blocks):
        for block in text_blocks[text_start:text_end]:
            text = block(text, attention_mask=text_mask)
        for block in visual_blocks[visual_start:visual_end]:
            visual = block(visual, attention_mask=visual_mask)
        text, visual = co_attention(text, visual, text_attention_mask=text_mask, visual_attention_mask=visual_mask)
        text_start, visual_start = text_end, visual_end
    for block in text_blocks[text_start:]:
        text = block(text, attention_mask=text_mask)
    for block in visual_blocks[visual_start:]:
        visual = block(visual, attention_mask=visual_mask)
    return text, visual
