"""What a decoding loop starts from: one small record instead of a long list
of positional arguments, shared by `decode_in_place` and `beam_search`."""

from typing import Any
from typing import NamedTuple


class DecodingState(NamedTuple):
    """The tensors a decoding loop starts from.

    Attributes:
        token_ids: `(batch, buffer_length)` int32: the prompts, right-padded
            with the pad id.
        prompt_mask: `(batch, buffer_length)` bool, true on prompt tokens
            (`None` for beam search, whose prompts all have `start_index`
            tokens).
        end_positions: `(batch,)` int32: row `b` writes no position at or
            past `end_positions[b]`.
        stop_token_ids: `(num_stop,)` int32; a row stops after emitting one
            (`[-1]` for none).
        start_index: int32 scalar, the first position to decode (the
            shortest prompt's length).
        cache: the model's cache, holding positions `[0, start_index − 1)`
            (a position-addressed cache may hold more: the steps rewrite
            them).
        constants: more tensors the step takes, the same at every step
            (e.g. weights laid out for decoding, an encoder's keys).
    """

    token_ids: Any
    prompt_mask: Any
    end_positions: Any
    stop_token_ids: Any
    start_index: Any
    cache: Any
    constants: tuple = ()
