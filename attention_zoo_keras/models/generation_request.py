"""What `generate` decodes, prepared in numpy before anything is compiled:
dict prompts read and checked (so that no row is dropped or misread
silently), the length arguments checked, and the right-padded buffer a
decoding loop fills (`GenerationRequest`)."""

import dataclasses
from typing import NamedTuple
from typing import Optional

import numpy as np
from keras import ops

from attention_zoo_keras.generation.decoding_controls import DecodingControls
from attention_zoo_keras.generation.generate_arguments import check_count
from attention_zoo_keras.naming import did_you_mean


def right_padded(prompts, length, pad_id):
    """`(token_ids, prompt_mask)` numpy arrays `(batch, length)` of the
    prompts (lists of ids), right-padded with `pad_id`."""
    token_ids = np.full((len(prompts), length), pad_id, dtype="int32")
    prompt_mask = np.zeros((len(prompts), length), dtype=bool)
    for row, ids in enumerate(prompts):
        token_ids[row, : len(ids)] = ids
        prompt_mask[row, : len(ids)] = True
    return token_ids, prompt_mask


def dict_prompt_arrays(inputs, ids_key, mask_key, row_name):
    """`(token_ids, mask)`: the numpy `(batch, length)` ids and bool mask of
    a dict prompt given to `generate`, checked, so that no row is dropped or
    misread silently.

    Args:
        inputs: dict. Holds `ids_key` and optionally `mask_key` (all ones
            when missing), each `(batch, length)` or `(length,)`.
        ids_key: str. The ids' key in the dict (`"token_ids"`).
        mask_key: str. The mask's key in the dict (`"padding_mask"`).
        row_name: str. What a row is, for messages (`"Prompt"`, `"Source"`).

    Raises:
        ValueError: an unknown or missing key, ids and mask of different
            shapes (both named), a mask value other than 0 and 1, an empty
            batch, or a row that is not right-padded.
        TypeError: ids that are not integers.
    """
    unknown = sorted(set(inputs) - {ids_key, mask_key})
    if unknown:
        raise ValueError(
            f"generate's dict input takes '{ids_key}' and '{mask_key}'; got the key '{unknown[0]}'."
            f"{did_you_mean(unknown[0], [ids_key, mask_key])}"
        )
    if ids_key not in inputs:
        raise ValueError(f"generate's dict input needs '{ids_key}'; got the keys {sorted(inputs)}.")
    token_ids = np.asarray(ops.convert_to_numpy(inputs[ids_key]))
    if token_ids.dtype.kind not in "iu":
        raise TypeError(f"'{ids_key}' must hold integer token ids; got the dtype {token_ids.dtype}.")
    if mask_key in inputs:
        mask = np.asarray(ops.convert_to_numpy(inputs[mask_key]))
        if mask.size and not np.isin(mask, (0, 1)).all():
            bad = mask[~np.isin(mask, (0, 1))].flat[0]
            raise ValueError(f"'{mask_key}' must hold 1 for a token and 0 for padding; got the value {bad}.")
        mask = mask.astype(bool)
    else:
        mask = np.ones(token_ids.shape, dtype=bool)
    if token_ids.ndim == 1 and mask.ndim == 1:
        token_ids, mask = token_ids[None], mask[None]
    if token_ids.ndim != 2 or mask.shape != token_ids.shape:
        raise ValueError(
            f"{ids_key} and {mask_key} must both be (batch, {row_name.lower()}_length); got the shapes "
            f"{token_ids.shape} and {mask.shape}."
        )
    if token_ids.shape[0] == 0:
        raise ValueError(f"generate needs at least one {row_name.lower()}; got an empty batch.")
    padding_before_a_token = (mask[:, 1:] & ~mask[:, :-1]).any(axis=1)
    if padding_before_a_token.any():
        raise ValueError(
            f"{row_name} {int(np.argmax(padding_before_a_token))}'s {mask_key} is not right-padded (real tokens "
            f"first, then padding); generate takes right-padded {row_name.lower()}s."
        )
    return token_ids, mask


def check_integer_arguments(max_length, max_new_tokens, seed):
    """Raises for a length or seed that is not a non-negative int (or
    `None`; `max_new_tokens` may also be a list of them, one per prompt),
    or for both lengths given."""
    check_count("max_length", max_length)
    if isinstance(max_new_tokens, (list, tuple, np.ndarray)):
        for count in max_new_tokens:
            check_count("Each of max_new_tokens", count.item() if isinstance(count, np.generic) else count)
    else:
        check_count("max_new_tokens", max_new_tokens)
    check_count("seed", seed)
    if max_length is not None and max_new_tokens is not None:
        raise ValueError(
            f"Give max_length or max_new_tokens, not both (got max_length={max_length}, "
            f"max_new_tokens={max_new_tokens})."
        )


def new_token_counts(max_new_tokens, batch):
    """`max_new_tokens` (one int, or one per prompt) as an int array
    `(batch,)`.

    Raises:
        ValueError: a list whose length is not the number of prompts.
    """
    counts = np.asarray(max_new_tokens, dtype="int64")
    if counts.ndim == 0:
        return np.full((batch,), int(counts))
    if counts.shape != (batch,):
        raise ValueError(
            f"max_new_tokens is a list of {counts.size} counts, but there are {batch} prompts: give one count per "
            "prompt, or a single int."
        )
    return counts


@dataclasses.dataclass
class GenerationRequest:
    """What `generate` decodes, in numpy: made by a family's
    `_prepare_generation`, read by the decoding template.

    Attributes:
        token_ids: int32 array of shape `(batch, buffer_length)`. The
            prompts right-padded with `pad_id`.
        prompt_mask: bool array of shape `(batch, buffer_length)`. True on
            prompt tokens.
        prompt_lengths: int array of shape `(batch,)`. The prompts' lengths.
        end_positions: int32 array of shape `(batch,)`. Row `b` ends before
            this position.
        stop_ids: tuple of int. The ids that end a row.
        pad_id: int. The id written after a row's end.
        is_text: bool. Whether the inputs were text.
        is_single: bool. Whether the inputs were a single string.
        conditioning: tuple of arrays. Numpy arrays per row besides the
            prompts that the output depends on (an encoder-decoder's
            sources).
        rules: tuple. Hashable settings of the task's score processor (they
            key the compiled program).
        controls: DecodingControls. The call's decoding controls (they key
            the compiled program too).
    """

    token_ids: np.ndarray
    prompt_mask: np.ndarray
    prompt_lengths: np.ndarray
    end_positions: np.ndarray
    stop_ids: tuple
    pad_id: int
    is_text: bool = False
    is_single: bool = False
    conditioning: tuple = ()
    rules: tuple = ()
    controls: DecodingControls = DecodingControls()


class DecodedRows(NamedTuple):
    """What a decoding program returns, in numpy, for the whole batch.

    Attributes:
        token_ids: int32 array of shape `(batch, buffer_length)`.
        valid: bool array of shape `(batch, buffer_length)`. True on the
            prompts' and generated tokens.
        scores: float32 array of shape `(batch, buffer_length)`, or None.
            The generated tokens' log-probabilities (where computed).
        sequence_scores: float32 array of shape `(batch,)`, or None. Beam
            search's length-penalised score of each best hypothesis.
    """

    token_ids: np.ndarray
    valid: np.ndarray
    scores: Optional[np.ndarray] = None
    sequence_scores: Optional[np.ndarray] = None
