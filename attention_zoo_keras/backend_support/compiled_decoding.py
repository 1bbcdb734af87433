"""Repeated model calls made cheap on each backend: decoding loops compiled
whole (JAX, TensorFlow), a step recorded once per input signature and
replayed (torch), and the in-place buffer writes that go with them."""

import warnings

import keras

from attention_zoo_keras.backend_support.environment import backend_name


def write_rows(buffer, start, update):
    """`buffer` with `update` written at `buffer[:, start : start + n]`.

    `start` may be a traced scalar. Under JAX and TensorFlow this is a
    dynamic-update-slice (XLA updates a loop-carried buffer in place). Under
    torch with gradient tracking off (generation runs under
    `torch.no_grad()`), the write is in place and `buffer` itself is
    returned: a key/value cache has a single owner, and Keras' functional
    `slice_update` would copy the whole cache at every decoding step. With
    gradients on, torch takes the functional path too.
    """
    if backend_name() == "torch":
        import torch

        if not torch.is_grad_enabled():
            buffer = keras.ops.convert_to_tensor(buffer).contiguous()  # (copies a broadcast view once)
            update = keras.ops.convert_to_tensor(update, dtype=buffer.dtype)
            start = keras.ops.convert_to_tensor(start).long()
            positions = start + torch.arange(update.shape[1], device=buffer.device)
            return buffer.index_copy_(1, positions, update)  # a tensor index: traceable (see compile_step)
    starts = [0, start] + [0] * (len(keras.ops.shape(buffer)) - 2)
    return keras.ops.slice_update(buffer, starts, keras.ops.cast(update, buffer.dtype))


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


def compile_inference(function, variables):
    """`function` compiled for repeated inference on this backend.

    `function(*tensors)` may read `variables` (the model's weights) and run
    `keras.ops.while_loop`s. Returned is a callable with the same arguments:

    * JAX: `jax.jit` of a stateless call: the variables' values are passed
      as arguments (not baked into the program as constants) and mapped
      back onto the variables with a `keras.StatelessScope`.
    * TensorFlow: a `tf.function` compiled by XLA (`jit_compile=True`).
    * torch: eager under `torch.no_grad()` (so cache writes happen in place,
      see `write_rows`); wrap the per-token model call in `compile_step`.

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


def compile_step(step, variables, on_new_signature=None):
    """`step`, a model call repeated with few input shapes, made cheap per call.

    Under JAX and TensorFlow it is returned as is: the loop around it is
    compiled whole (`compile_inference`, Keras' compiled `predict`). Under
    torch Keras runs every layer call through its Python machinery, which
    for a small model or a one-token decoding step costs more than the
    matrix products (GPT-2 small, batch 1: 70 ms eager against 24 ms traced
    on 2 CPU cores), so `step` is recorded once per input signature with
    `torch.jit.trace` and replayed:

    * the weights are inputs of the trace (mapped onto `variables` with a
      `StatelessScope`), so the trace never holds stale weights;
    * variables that `step` assigns (a stream memory) are outputs of the
      trace, assigned after each replay;
    * a step that draws random numbers (assigns a Keras
      `SeedGenerator`'s `seed_generator_state`) would replay one frozen
      draw, so its signature runs eagerly instead.

    Shapes and Python branches are baked into a trace, so `step` must not
    branch on tensor values; a cache position is passed as a tensor so that
    one trace serves every step. (`torch.jit.trace` is deprecated in favour
    of `torch.export`, which cannot yet trace through Keras layers' Python;
    the torch version is pinned.)

    Args:
        step: a function of (nested structures of) tensors returning
            (nested structures of) tensors.
        variables: every Keras variable `step` reads.
        on_new_signature: called with a signature (the arguments' nesting
            and a `(shape, dtype)` per input tensor) before it is recorded,
            under torch.

    Returns:
        A function with `step`'s arguments and results; under torch it has
        the attribute `signatures`: the recorded signatures (a live view).
    """
    if backend_name() != "torch":
        return step
    traces = {}

    def traced_step(*args):
        flat_args = [keras.ops.convert_to_tensor(t) for t in keras.tree.flatten(args)]
        weights = [variable.value.detach() for variable in variables]
        # The nesting (e.g. a dict's names) and each tensor's shape and dtype.
        nesting = repr(keras.tree.map_structure(lambda _: "", args))
        signature = (nesting, tuple((tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in flat_args))
        if signature not in traces:
            if on_new_signature is not None:
                on_new_signature(signature)
            traces[signature] = _torch_trace(step, args, variables, weights, flat_args)
        recorded = traces[signature]
        if recorded is None:  # the step draws random numbers
            return step(*args)
        traced, structure, assigned = recorded
        flat_outputs = traced(*weights, *flat_args)
        num_outputs = len(flat_outputs) - len(assigned)
        for index, value in zip(assigned, flat_outputs[num_outputs:]):
            variables[index].assign(value)
        return keras.tree.pack_sequence_as(structure, list(flat_outputs[:num_outputs]))

    traced_step.signatures = traces.keys()
    return traced_step


def _torch_trace(step, args, variables, weights, flat_args):
    """`step(*args)` recorded by `torch.jit.trace` as a function of
    `(*weights, *flat_args)` returning its flat outputs and then the new
    values of the variables it assigned; returns `(trace, output nesting,
    indices of the assigned variables)`, or `None` if `step` draws random
    numbers (see `compile_step`)."""
    import torch

    recorded = {}

    def flat_step(*inputs):
        values, flat = inputs[: len(weights)], inputs[len(weights) :]
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            initial = [scope.get_current_value(variable) for variable in variables]
            outputs = step(*keras.tree.pack_sequence_as(args, list(flat)))
        final = [scope.get_current_value(variable) for variable in variables]
        assigned = [index for index, value in enumerate(final) if value is not initial[index]]
        recorded.update(structure=outputs, assigned=assigned)
        recorded["draws_random_numbers"] = any(variables[i].name == "seed_generator_state" for i in assigned)
        return (*keras.tree.flatten(outputs), *(final[index] for index in assigned))

    with warnings.catch_warnings():
        # Shapes and Python constants are baked into the trace by design
        # (one trace per signature); the API is deprecated.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(flat_step, (*weights, *flat_args), check_trace=False)
    if recorded["draws_random_numbers"]:
        return None
    return traced, recorded["structure"], recorded["assigned"]


def materialize(x):
    """`x` laid out densely in its own memory: under torch, a transposed view
    becomes a contiguous copy (so products with it stream rows); under JAX and
    TensorFlow arrays have no views and `x` is returned as is."""
    if backend_name() == "torch":
        return keras.ops.convert_to_tensor(x).contiguous()
    return x
