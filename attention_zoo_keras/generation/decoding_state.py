"""What a decoding loop starts from: one small record instead of a long list
of positional arguments, shared by `decode_in_place` and `beam_search`."""

from typing import Any
from typing import NamedTuple


class DecodingState(NamedTuple):
    """The tensors a decoding loop starts from.

    Attributes:
        token_ids: int32 tensor of shape `(batch, buffer_length)`. The
            prompts, right-padded with the pad id.
        prompt_mask: bool tensor of shape `(batch, buffer_length)`, or None.
            True on prompt tokens (`None` for beam search, whose prompts all
            have `start_index` tokens).
        end_positions: int32 tensor of shape `(batch,)`. Row `b` writes no
            position at or past `end_positions[b]`.
        stop_token_ids: int32 tensor of shape `(num_stop,)`. A row stops
            after emitting one (`[-1]` for none).
        start_index: int32 scalar tensor. The first position to decode (the
            shortest prompt's length).
        start_index_bound: int. A Python int at least `start_index`, known
            when a compiled program is traced (where `start_index` is not),
            and past every position the cache holds: a cache that grows
            (`generation.cache_growth`) takes only sizes above it.
        cache: nested tuple of tensors. The model's cache, holding positions
            `[0, start_index − 1)` (a position-addressed cache may hold more:
            the steps rewrite them).
        constants: tuple of tensors. More tensors the step takes, the same
            at every step (e.g. weights laid out for decoding, an encoder's
            keys).
    """

    token_ids: Any
    prompt_mask: Any
    end_positions: Any
    stop_token_ids: Any
    start_index: Any
    start_index_bound: int
    cache: Any
    constants: tuple = ()
