"""A decoding cache that grows with the positions written.

A key/value cache sized for the whole buffer costs the whole buffer at every
step: attention reads every slot (the unwritten ones masked out) and beam
search copies every slot when it reorders its beams. Where a step costs the
bytes it moves (a CPU) and the cache moves a sizeable share of them next to
the weights, the loop instead runs in segments, one per cache size
`s₁ < s₂ < … = buffer_length` (`backend_support.decoding_cache_sizes`):

    for s in sizes:
        cache ← resized(cache, s)          # positions < s kept, zeros after
        run the loop while index ≤ s       # a step at index i feeds position i − 1

so a step attends over at most twice the positions written so far. The
result is the one-size loop's, token for token: the slots past the written
positions are masked out either way.
"""

from typing import Callable
from typing import NamedTuple

import keras
import ml_dtypes
import numpy as np

from attention_zoo_keras.attention.registry import get_decoding
from attention_zoo_keras.backend_support import decoding_cache_sizes


class CacheGrowth(NamedTuple):
    """How a task's decoding cache grows.

    Attributes:
        resize: callable. `resize(cache, size)`, the cache with room for
            positions `[0, size)` (see `DecodingCache.resized`).
        weight_bytes: int. The bytes of the weights a decoding step reads,
            against which the cache's traffic is weighed.
    """

    resize: Callable
    weight_bytes: int


def layer_cache_growth(attention_layers, weights):
    """`CacheGrowth` for a cache holding one entry per layer of
    `attention_layers` (`MultiHeadAttention`s, in order), each resized by its
    mechanism's decoding, in a model whose step reads `weights`; `None` if
    one of the layers' caches cannot change size (a recurrent state, LSH
    buckets)."""
    decodings = [get_decoding(layer.attention) for layer in attention_layers]
    if not all(decoding.resizable for decoding in decodings):
        return None

    def resize(cache, size):
        return tuple(decoding.resized(entry, size) for decoding, entry in zip(decodings, cache))

    return CacheGrowth(resize, sum(_byte_size(weight.shape, weight.dtype) for weight in weights))


def cache_sizes(token_ids, first_position, cache, reads_per_step, growth):
    """The sizes the cache takes while a loop writes the buffer `token_ids`
    from `first_position` on (`backend_support.decoding_cache_sizes`), given
    the cache's traffic in a step, `reads_per_step` passes over `cache`
    (attention's read; beam search's reordering copy adds a read and a
    write), against one pass over the weights.

    Args:
        token_ids: tensor of shape `(batch, buffer_length)`. The loop's
            token buffer.
        first_position: int. The first position the loop writes, or a bound
            on it (`DecodingState.start_index_bound`).
        cache: nested tuple of tensors. The cache at the buffer's size.
        reads_per_step: int. The passes a step makes over the cache.
        growth: CacheGrowth or None. `None` for a cache that keeps its size.
    """
    if growth is None:
        return (int(token_ids.shape[1]),)
    cache_bytes = sum(_byte_size(tensor.shape, tensor.dtype) for tensor in keras.tree.flatten(cache))
    return decoding_cache_sizes(token_ids, first_position, reads_per_step * cache_bytes, growth.weight_bytes)


def run_with_growing_cache(run_until, loop_state, token_ids, first_position, growth, reads_per_step):
    """Runs a decoding loop from `loop_state` to the end of the buffer
    `token_ids`, the cache resized to each of its sizes in turn
    (`cache_sizes`).

    Args:
        run_until: callable. `run_until(loop_state, until) -> loop_state`,
            the loop run while its index is below `until` (and its own
            condition holds).
        loop_state: tuple. The loop's state; its last element is the cache,
            at the buffer's size.
        token_ids: tensor of shape `(batch, buffer_length)`. The loop's
            token buffer.
        first_position: int. As for `cache_sizes`.
        growth: CacheGrowth or None. `None` for a cache that keeps its size.
        reads_per_step: int. As for `cache_sizes`.

    Returns:
        The loop's state after its last step.
    """
    buffer_length = int(token_ids.shape[1])
    for size in cache_sizes(token_ids, first_position, loop_state[-1], reads_per_step, growth):
        if growth is not None:
            loop_state = (*loop_state[:-1], growth.resize(loop_state[-1], size))
        loop_state = run_until(loop_state, min(size + 1, buffer_length))
    return loop_state


def grown_for(loop_state, until, sizes, growth):
    """`loop_state` with its cache (the last element) resized to the
    smallest of `sizes` that holds every position a run of the loop up to
    `until` feeds (`until − 1` of them): how a stream, run in chunks
    (`in_place_decoding.decode_until`), grows its cache before each chunk.

    Args:
        loop_state: tuple. The loop's state; its last element is the cache.
        until: int. Where the next chunk stops.
        sizes: tuple of int. `cache_sizes`' result.
        growth: CacheGrowth or None. `None` for a cache that keeps its size.
    """
    if growth is None:
        return loop_state
    size = next(size for size in sizes if size + 1 >= until)
    return (*loop_state[:-1], growth.resize(loop_state[-1], size))


def _byte_size(shape, dtype):
    dtype = keras.backend.standardize_dtype(dtype)
    itemsize = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).itemsize
    return int(np.prod(tuple(shape), dtype=np.int64)) * itemsize
