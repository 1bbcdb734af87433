"""Decoding loops made cheap on each backend: compiled whole (JAX,
TensorFlow) or run without gradient tracking around a recorded body
(torch, see `recorded_steps`), and the in-place buffer writes and
branch-free rules that go with them."""

import keras

from attention_zoo_keras.backend_support.environment import backend_name
from attention_zoo_keras.backend_support.environment import is_concrete
from attention_zoo_keras.backend_support.environment import jax_compiles_for_gpu


def write_rows(buffer, start, update):
    """`buffer` with `update` written at `buffer[:, start : start + n]`.

    `start` may be a traced scalar. Under JAX and TensorFlow this is a
    dynamic-update-slice (XLA updates a loop-carried buffer in place). Under
    torch with gradient tracking off (generation runs under
    `torch.no_grad()`), the write is in place and `buffer` itself is
    returned: a key/value cache, like a decoding loop's token buffer, has a
    single owner, and Keras' functional `slice_update` would copy it whole
    at every decoding step (and, with a Python slice, freeze the position
    into a recording). With gradients on (and while an exporter traces
    it), torch writes a copy with the same `index_copy`, whose int64
    positions ONNX accepts (Keras' `slice_update` scatters with int32 ones,
    which ONNX Runtime refuses).
    """
    if backend_name() == "torch":
        import torch

        buffer = keras.ops.convert_to_tensor(buffer)
        update = keras.ops.convert_to_tensor(update, dtype=buffer.dtype)
        start = keras.ops.convert_to_tensor(start).long()
        positions = start + torch.arange(update.shape[1], device=buffer.device)
        if torch.is_grad_enabled():
            return buffer.index_copy(1, positions, update)
        # In place; a tensor index is traceable (see recorded_steps).
        return buffer.contiguous().index_copy_(1, positions, update)  # (`contiguous` copies a broadcast view once)
    starts = [0, start] + [0] * (len(keras.ops.shape(buffer)) - 2)
    return keras.ops.slice_update(buffer, starts, keras.ops.cast(update, buffer.dtype))


def reorder_rows(buffer, rows):
    """`buffer[rows]` (rows along the first axis), as beam search reorders
    its caches at every step.

    Under torch on CUDA with gradient tracking off the result is written
    back into `buffer` itself (a cache has a single owner), so that a loop
    replayed from a CUDA graph keeps reading and writing the same memory
    instead of cloning a new cache out of the graph and copying it back in
    at every step. Elsewhere it is a `take`: one pass over the cache rather
    than two (on a CPU, beam-4 Marian translation ran 15 % slower in place).
    """
    if backend_name() == "torch":
        import torch

        buffer = keras.ops.convert_to_tensor(buffer)
        if not torch.is_grad_enabled() and buffer.is_cuda:
            buffer = buffer.contiguous()
            rows = keras.ops.convert_to_tensor(rows).long()
            return buffer.copy_(buffer.index_select(0, rows))
    return keras.ops.take(buffer, rows, axis=0)


# How many steps a decoding loop on a GPU runs between two tests of its
# condition (see `decoding_while_loop`).
_STEPS_BETWEEN_TESTS_ON_GPU = 8


def decoding_while_loop(keep_going, body, loop_vars, max_steps):
    """`keras.ops.while_loop(keep_going, body, loop_vars)` for a loop that
    ends within `max_steps` iterations (an int scalar) and whose body,
    once `keep_going` is false, changes nothing the caller reads (a
    sampling loop whose rows are all done writes pad ids where pad ids
    already are).

    On a GPU the condition is tested every 8 steps, not at every step:
    each test brings a device value to the host, so the host waits for the
    GPU to finish every queued step and the GPU then idles while the host
    launches the next one.

    * torch on CUDA: the Python loop runs 8 bodies between two reads of
      `keep_going`; the host queues steps ahead of the GPU.
    * JAX on a GPU: the compiled loop's iteration is 8 steps, a loop with
      a fixed trip count, which XLA runs without reading its condition
      back; the last fewer than 8 steps before `max_steps` run one
      iteration each, so no step runs past `max_steps`.

    At most 7 steps run after `keep_going` turned false. Elsewhere (on a
    CPU nothing runs ahead; TensorFlow on a GPU was not measured) this is
    `keras.ops.while_loop`.
    """
    steps_between_tests = _steps_between_tests(loop_vars)
    if steps_between_tests == 1:
        return keras.ops.while_loop(keep_going, body, loop_vars)
    if backend_name() == "jax":
        return _while_loop_in_blocks(keep_going, body, tuple(loop_vars), max_steps, steps_between_tests)
    loop_vars = tuple(keras.tree.map_structure(keras.ops.convert_to_tensor, tuple(loop_vars)))
    steps_left = int(keras.ops.convert_to_numpy(max_steps))
    while steps_left > 0 and bool(keep_going(*loop_vars)):
        for _ in range(min(steps_between_tests, steps_left)):
            loop_vars = tuple(body(*loop_vars))
        steps_left -= steps_between_tests
    return loop_vars


def _while_loop_in_blocks(keep_going, body, loop_vars, max_steps, block):
    """The compiled form of `decoding_while_loop`: while `keep_going` and
    `block` more steps fit in `max_steps`, run `block` steps (a fixed-count
    inner loop); then single steps up to `max_steps`, testing each."""

    def run_block(steps, loop_vars):
        loop_vars = keras.ops.fori_loop(0, block, lambda _, loop_vars: tuple(body(*loop_vars)), loop_vars)
        return steps + block, loop_vars

    def block_fits(steps, loop_vars):
        return keras.ops.logical_and(keras.ops.less_equal(steps + block, max_steps), keep_going(*loop_vars))

    def run_step(steps, loop_vars):
        return steps + 1, tuple(body(*loop_vars))

    def step_fits(steps, loop_vars):
        return keras.ops.logical_and(keras.ops.less(steps, max_steps), keep_going(*loop_vars))

    counted = (keras.ops.zeros((), "int32"), loop_vars)
    counted = keras.ops.while_loop(block_fits, run_block, counted)
    return keras.ops.while_loop(step_fits, run_step, counted)[1]


def _steps_between_tests(loop_vars):
    """`_STEPS_BETWEEN_TESTS_ON_GPU` for a torch loop on CUDA or a JAX loop
    compiled for a GPU, else 1."""
    if backend_name() != "torch":
        return _STEPS_BETWEEN_TESTS_ON_GPU if jax_compiles_for_gpu() else 1
    first = keras.ops.convert_to_tensor(keras.tree.flatten(loop_vars)[0])
    return _STEPS_BETWEEN_TESTS_ON_GPU if first.is_cuda else 1


# The smallest size a decoding cache grows from on a CPU (see
# `decoding_cache_sizes`); every later size doubles it.
_SMALLEST_GROWN_CACHE = 16
# The share of a step's memory traffic (the cache's bytes moved per step over
# the weights' bytes) from which growing the cache pays for its recordings.
_GROWTH_PAYS_FROM_SHARE = 0.5
# The cache's bytes moved per step below which a step costs its Python
# dispatch, not its bytes, and growing the cache only adds segments.
_GROWTH_PAYS_FROM_BYTES = 8 * 2**20


def decoding_cache_sizes(token_ids, first_position, cache_traffic, weight_bytes):
    """The sizes, in order, that a position-addressed decoding cache takes
    while a loop writes the `(batch, buffer_length)` buffer `token_ids`
    from `first_position` on (the last size is `buffer_length`; see
    `generation.cache_growth`). `first_position` is a Python int: the first
    position the loop writes, or a bound on it known when a program is
    traced (every size is above it, so a resized cache keeps what the
    prompt pass wrote).

    On a CPU, where the cache moves (`cache_traffic`, bytes per step) at
    least half as many bytes per step as the weights (`weight_bytes`) and
    at least 8 MiB, the cache grows: 16, 32, 64, … (those between
    `first_position` and `buffer_length`), then `buffer_length`. A step
    there costs the bytes it moves: attention reads every slot of the cache
    and beam search copies every slot to reorder its beams, so a
    buffer-sized cache costs the whole buffer at every step, where the
    written positions are on average half of it. Each size is one more
    recording of the step on a shape's first call under torch (about 1.5 s
    for a 6-layer decoder) and one more loop in the compiled program under
    JAX and TensorFlow (0.7 s each), so a smaller share is not worth it:
    Marian-shaped beam search (share 1.4) ran 12 % faster under torch, 10
    to 15 % under JAX and 13 % under TensorFlow; greedy translation (0.11)
    and GPT-2 (0.03 to 0.23) no faster and 2 to 6 s slower to start
    (torch). Nor is a small cache, whatever its share, since a small
    model's step costs its Python dispatch: a 32-wide translation model's
    beam search ran 7 to 20 % slower grown with 0.4 MB of cache traffic a
    step, level with 6.3 MB, 6 % faster with 12.6 MB (torch). The sizes
    are a fixed ladder, so a recorded step or a compiled program serves
    every request.

    On a GPU the cache keeps one size, `(buffer_length,)`: a step there is
    bound by launches rather than memory (and JAX's cuDNN kernel skips the
    keys past each row's length), and under torch each size would be one
    more captured CUDA graph (not measured to pay).
    """
    buffer_length = int(keras.ops.shape(token_ids)[1])
    pays = cache_traffic >= max(_GROWTH_PAYS_FROM_SHARE * weight_bytes, _GROWTH_PAYS_FROM_BYTES)
    if not pays or not _grows_decoding_caches(token_ids):
        return (buffer_length,)
    sizes, size = [], _SMALLEST_GROWN_CACHE
    while size < buffer_length:
        if size > first_position:
            sizes.append(size)
        size *= 2
    return (*sizes, buffer_length)


def _grows_decoding_caches(token_ids):
    """Whether a decoding loop over `token_ids` may grow its cache: on a
    CPU."""
    backend = backend_name()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.config.list_logical_devices("GPU")
    return not keras.ops.convert_to_tensor(token_ids).is_cuda


def apply_when(condition, function, x):
    """`function(x)` if the scalar `condition` holds, else `x`; `function`
    must return `x` unchanged whenever `condition` is false, so skipping it
    only saves work (a decoding rule that applies at a row's last step).

    The skip is `ops.cond` (XLA's conditional, or a Python branch in an
    eager torch loop). While torch records a step (`recorded_steps`), a
    branch on a value would be frozen into the recording, so `function(x)`
    is computed unconditionally instead.
    """
    if backend_name() == "torch" and not is_concrete(x):
        return function(x)
    return keras.ops.cond(condition, lambda: function(x), lambda: x)


def fill_columns(scores, columns, value):
    """`scores` `(batch, vocabulary)` with the `columns` (a list of ints)
    set to `value`, as a decoding loop suppresses token ids at every step.

    Under torch the loop runs eagerly and this writes the few columns in
    place (`index_fill_`): a `where` would read and write every score, one
    pass over `batch × vocabulary` floats per step (about 14 ms a step for
    4 beams of 16 Marian sentences on 2 CPU cores). `scores` must be a
    fresh tensor the caller owns. Under JAX and TensorFlow it is a `where`
    that XLA fuses with its neighbours.
    """
    if backend_name() == "torch":
        import torch

        scores = keras.ops.convert_to_tensor(scores)
        return scores.index_fill_(1, torch.tensor(columns, device=scores.device), value)
    vocabulary = keras.ops.arange(keras.ops.shape(scores)[-1])
    chosen = keras.ops.any(vocabulary[:, None] == keras.ops.convert_to_tensor(list(columns))[None, :], axis=-1)
    return keras.ops.where(chosen[None, :], keras.ops.cast(value, scores.dtype), scores)


def marked_columns(columns, vocabulary):
    """A bool mask `(rows, vocabulary)`, true at `[r, columns[r, j]]` for
    every `j`: the token ids a decoding rule names per row (those present
    in a row, those that would repeat an n-gram). An entry equal to
    `vocabulary` marks nothing, so a rule writes it where it names no id.

    `columns` is an int tensor `(rows, n)` with entries in `[0,
    vocabulary]`. The mask is a scatter into `vocabulary + 1` columns, the
    last one dropped: one pass over the `rows × n` entries, not a
    comparison of each with every id. Under torch it is `scatter_` (Keras'
    `ops.scatter` loops over the entries in Python there); elsewhere
    `ops.scatter`, which XLA compiles.
    """
    rows, width = keras.ops.shape(columns)
    if backend_name() == "torch":
        import torch

        columns = keras.ops.convert_to_tensor(columns).long()
        mask = torch.zeros((rows, vocabulary + 1), dtype=torch.bool, device=columns.device)
        # (a tensor source: `torch.jit.trace` has no `scatter_` of a Python bool)
        return mask.scatter_(1, columns, torch.ones_like(columns, dtype=torch.bool))[:, :vocabulary]
    row_ids = keras.ops.broadcast_to(keras.ops.arange(rows, dtype="int32")[:, None], (rows, width))
    indices = keras.ops.stack([row_ids, keras.ops.cast(columns, "int32")], axis=-1)
    counts = keras.ops.scatter(keras.ops.reshape(indices, (-1, 2)), keras.ops.ones((rows * width,), "int32"),
                               (rows, vocabulary + 1))
    return keras.ops.greater(counts[:, :vocabulary], 0)


def compile_inference(function, variables):
    """`function` compiled for repeated inference on this backend.

    `function(*tensors)` may read `variables` (the model's weights) and run
    `keras.ops.while_loop`s. Returned is a callable with the same arguments:

    * JAX: `jax.jit` of a stateless call: the variables' values are passed
      as arguments (not baked into the program as constants) and mapped
      back onto the variables with a `keras.StatelessScope`.
    * TensorFlow: a `tf.function` compiled by XLA (`jit_compile=True`).
    * torch: eager under `torch.no_grad()` (so cache writes happen in place,
      see `write_rows`); the loop's body is recorded by `compile_step`.

    Each backend retraces for new input shapes; callers keep shapes few by
    rounding buffer lengths up.
    """
    backend = backend_name()
    if backend == "jax":
        import jax

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return function(*args)

        jitted = jax.jit(stateless)
        return lambda *args: jitted([variable.value for variable in variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True)
    if backend == "torch":
        import torch

        def no_grad(*args):
            with torch.no_grad():
                return function(*args)

        return no_grad
    return function


def materialize(x):
    """`x` laid out densely in its own memory: under torch, a transposed view
    becomes a contiguous copy (so products with it stream rows); under JAX and
    TensorFlow arrays have no views and `x` is returned as is."""
    if backend_name() == "torch":
        return keras.ops.convert_to_tensor(x).contiguous()
    return x
