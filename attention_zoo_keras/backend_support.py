"""The one place that knows which backend Keras runs on.

Everything else in the library is written against `keras.ops`. The questions
whose answer depends on the backend live here: is a tensor a concrete value
(so its contents can be checked before entering a compiled graph), and which
fused attention kernel `keras.ops.dot_product_attention` reaches on this
machine. Backend modules are imported only when they are the active backend,
so importing this library under JAX or PyTorch never imports TensorFlow.
"""

import contextlib
import warnings

import keras
import numpy as np


def backend_name():
    """`"jax"`, `"tensorflow"` or `"torch"`."""
    return keras.backend.backend()


def is_concrete(value):
    """Whether `value` holds real numbers now (not a symbolic or traced tensor).

    Numpy arrays, Python lists and eager tensors are concrete; Keras symbolic
    tensors, JAX tracers, TensorFlow graph tensors, torch tensors on the
    meta device (used by Keras for shape inference) and torch tensors met
    while `torch.compile` or `torch.jit.trace` records a program are not.
    """
    if isinstance(value, (np.ndarray, np.generic, list, tuple, int)):
        return True
    if isinstance(value, keras.KerasTensor):
        return False
    backend = backend_name()
    if backend == "jax":
        import jax

        return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)
    if backend == "tensorflow":
        import tensorflow as tf

        return isinstance(value, tf.Tensor) and hasattr(value, "numpy")
    if backend == "torch":
        import torch

        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return False
        return isinstance(value, torch.Tensor) and value.device.type != "meta"
    return False


def accelerator():
    """`"gpu"`, `"tpu"` or `"cpu"`: where the backend places new tensors."""
    backend = backend_name()
    if backend == "jax":
        import jax

        return jax.default_backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def fused_attention_kernel():
    """Names the kernel `keras.ops.dot_product_attention` runs on this machine.

    Keras dispatches to the backend's own fused implementation; on GPU it
    may further pick a flash-attention kernel. JAX: cuDNN's fused attention
    for fp16/bf16 only, and only when the mask is absent or already
    `(..., T, S)` (cuDNN takes the mask as a bias of exactly `(T, S)`; a
    broadcastable `(B, 1, 1, S)` mask makes Keras fall back to XLA's unfused
    attention, which `mask_for_fused_attention` avoids); float32 always runs
    on XLA. torch: SDPA picks FlashAttention,
    cuDNN or memory-efficient attention (float32 too). Measured in
    `benchmarks/gpu_attention_benchmark.py`.
    """
    backend = backend_name()
    device = accelerator()
    if backend == "jax":
        kernel = "jax.nn.dot_product_attention"
        if device != "gpu":
            return f"{kernel} (xla)"
        return f"{kernel} (cudnn fused attention for fp16/bf16 with no mask or a (..., T, S) mask; xla otherwise)"
    if backend == "torch":
        return f"torch.nn.functional.scaled_dot_product_attention ({device})"
    if backend == "tensorflow":
        return f"keras tensorflow dot_product_attention ({device}, xla-fusable)"
    return "keras.ops.dot_product_attention"


def mask_for_fused_attention(mask, query_length, key_length):
    """`mask` in the shape that lets `keras.ops.dot_product_attention` reach
    the fused kernel. On JAX, cuDNN takes the mask as a bias of exactly
    `(..., T, S)`; a broadcastable `(B, 1, 1, S)` padding mask makes Keras
    fall back to XLA's unfused attention on GPU, so it is broadcast (a
    boolean `B·T·S` tensor, cheap beside the attention itself). Elsewhere
    the mask is returned as is."""
    if mask is None or backend_name() != "jax":
        return mask
    return keras.ops.broadcast_to(mask, tuple(keras.ops.shape(mask)[:-2]) + (query_length, key_length))


def native_fused_attention():
    """The backend's fused attention kernel called directly, or `None`
    where `keras.ops.dot_product_attention` is the way to it.

    PyTorch's `scaled_dot_product_attention`: it drops out attention
    probabilities inside the kernel (`keras.ops.dot_product_attention`
    takes no dropout; torch's own random generator is used, which
    `keras.utils.set_random_seed` seeds), and it reads strided (transposed)
    inputs, where Keras' torch `dot_product_attention` copies the query,
    key and value to contiguous memory at every call whenever it does not
    pick the flash kernel (always with a mask on a CPU: about 6 % of a
    Marian-sized decoding step, mostly copying the key/value caches). The
    returned function takes `(query, key, value, mask, scale,
    dropout_rate=0.0, is_causal=False)` with `(batch, length, heads,
    head_dim)` tensors and a boolean mask broadcastable to `(batch, heads,
    query_length, key_length)`, or `None` (with `is_causal`, the kernel's
    own causal mode). The mask enters as a large negative bias, as
    in Keras, so a query that may attend nowhere averages the values on
    every backend (a boolean mask would give torch zeros there).
    """
    return _torch_attention if backend_name() == "torch" else None


def _torch_attention(query, key, value, mask, scale, dropout_rate=0.0, is_causal=False):
    import torch

    query, key, value = (torch.transpose(keras.ops.convert_to_tensor(t), 1, 2) for t in (query, key, value))
    if mask is not None:
        mask = keras.ops.convert_to_tensor(mask, dtype="bool")
        mask = torch.where(mask, 0.0, -0.7 * torch.finfo(query.dtype).max).to(query.dtype)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_rate, is_causal=is_causal, scale=scale
    )
    return torch.transpose(output, 1, 2)


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


def vjp(function, primals):
    """`function(primals)` and its vector-Jacobian product, on this backend.

    Args:
        function: maps a list of tensors to one tensor.
        primals: the list of tensors to differentiate with respect to.

    Returns:
        `(output, pullback)`: `pullback(cotangent)` returns the list of
        gradients of `sum(output * cotangent)` with respect to `primals`
        (zeros where a primal does not reach the output). Call it once.
        `output` carries no gradient. JAX: `jax.vjp`. TensorFlow: a
        `tf.GradientTape` watching `primals`. torch: `primals` detached and
        marked as requiring gradients under `torch.enable_grad()` (so it works
        inside an `autograd.Function.backward`), then `torch.autograd.grad`.
    """
    backend = backend_name()
    if backend == "jax":
        import jax

        output, pull = jax.vjp(lambda *args: function(list(args)), *primals)
        return output, lambda cotangent: list(pull(cotangent))
    if backend == "tensorflow":
        import tensorflow as tf

        primals = [tf.convert_to_tensor(p) for p in primals]
        with tf.GradientTape() as tape:
            tape.watch(primals)
            output = function(primals)

        def tf_pullback(cotangent):
            return tape.gradient(
                output, primals, output_gradients=cotangent, unconnected_gradients=tf.UnconnectedGradients.ZERO
            )

        return tf.stop_gradient(output), tf_pullback
    if backend == "torch":
        import torch

        with torch.enable_grad():
            leaves = [keras.ops.convert_to_tensor(p).detach().requires_grad_() for p in primals]
            output = function(leaves)

        def torch_pullback(cotangent):
            grads = torch.autograd.grad(output, leaves, cotangent, allow_unused=True)
            return [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads)]

        return output.detach(), torch_pullback
    raise NotImplementedError(f"The {backend} backend has no automatic differentiation.")


def custom_gradient_from_outputs(forward, backward):
    """A function with a hand-written backward pass that keeps only its
    outputs, parameters and constants for that pass -- not its inputs, nor
    anything `forward` computed on the way. Reversible layers use it: their
    backward pass rebuilds the inputs from the outputs.

    `forward(inputs, params, constants)` returns a list of output tensors;
    `backward(outputs, params, constants, output_grads)` returns
    `(input_grads, param_grads)`, lists of tensors matching `inputs` and
    `params`. `params` (weights) are differentiated; `constants` (integer
    seeds, masks, frozen weights) are not.

    Returns `apply(inputs, params, constants)` computing `forward`'s outputs
    with that gradient, or `None` where the backend has no custom gradients
    (numpy, openvino); callers then run `forward` with ordinary autodiff.

    * JAX: `jax.custom_vjp`; the residuals are the outputs, params and
      constants. Weights must come in as `params` (with Keras' stateless
      training they are traced values, and a custom VJP may not close over
      them).
    * TensorFlow: `tf.custom_gradient`. `forward` sees its arguments through
      `tf.stop_gradient`, so an active tape records none of its operations
      (eager `tf.custom_gradient` would otherwise record them, and keep their
      activations alive). Weights come in as tensors read from the
      variables, so the tape carries their gradient on to the variables.
    * torch: a `torch.autograd.Function`: `forward` runs without gradient
      tracking and `save_for_backward` holds the outputs, params and
      constants; gradients reach `torch.nn.Parameter` params (Keras
      variables' values) through autograd as usual.

    (`keras.ops.custom_gradient` does not serve here in Keras 3.15: under
    torch it allows one output only -- its `backward` takes one upstream
    gradient -- and saves every input; under torch and JAX weights read
    inside the function silently get no gradient, and TensorFlow refuses
    them unless `grad` takes a `variables` keyword; and `grad`'s signature
    differs between torch and the other two.)
    """
    backend = backend_name()
    if backend == "jax":
        import jax

        @jax.custom_vjp
        def run(inputs, params, constants):
            return list(forward(inputs, params, constants))

        def run_forward(inputs, params, constants):
            outputs = list(forward(inputs, params, constants))
            return outputs, (outputs, params, constants)

        def run_backward(residuals, output_grads):
            outputs, params, constants = residuals
            input_grads, param_grads = backward(outputs, params, constants, list(output_grads))
            return list(input_grads), list(param_grads), [None] * len(constants)

        run.defvjp(run_forward, run_backward)
        return lambda inputs, params, constants: run(list(inputs), list(params), list(constants))
    if backend == "tensorflow":
        import tensorflow as tf

        def tf_apply(inputs, params, constants):
            counts = (len(inputs), len(params))

            @tf.custom_gradient
            def run(*flat):
                flat = [tf.stop_gradient(t) for t in flat]
                inputs, params = flat[: counts[0]], flat[counts[0] : sum(counts)]
                constants = flat[sum(counts) :]
                outputs = list(forward(inputs, params, constants))

                def grad(*output_grads):
                    output_grads = [
                        tf.zeros_like(out) if g is None else g for out, g in zip(outputs, output_grads)
                    ]
                    input_grads, param_grads = backward(outputs, params, constants, output_grads)
                    return [*input_grads, *param_grads] + [None] * len(constants)

                return outputs, grad

            flat = [tf.convert_to_tensor(t) for t in (*inputs, *params, *constants)]
            return list(run(*flat))

        return tf_apply
    if backend == "torch":
        return _torch_custom_gradient_from_outputs(forward, backward)
    return None


def _torch_custom_gradient_from_outputs(forward, backward):
    import torch

    class FromOutputs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, counts, *flat):
            inputs, params = list(flat[: counts[0]]), list(flat[counts[0] : sum(counts)])
            constants = list(flat[sum(counts) :])
            outputs = list(forward(inputs, params, constants))
            ctx.counts = counts
            ctx.num_outputs = len(outputs)
            ctx.save_for_backward(*outputs, *params, *constants)
            return tuple(outputs)

        @staticmethod
        def backward(ctx, *output_grads):
            saved = ctx.saved_tensors
            num_inputs, num_params = ctx.counts
            outputs = list(saved[: ctx.num_outputs])
            params = list(saved[ctx.num_outputs : ctx.num_outputs + num_params])
            constants = list(saved[ctx.num_outputs + num_params :])
            input_grads, param_grads = backward(outputs, params, constants, list(output_grads))
            return (None, *input_grads, *param_grads) + (None,) * len(constants)

    def torch_apply(inputs, params, constants):
        flat = [keras.ops.convert_to_tensor(t) for t in (*inputs, *params, *constants)]
        return list(FromOutputs.apply((len(inputs), len(params)), *flat))

    return torch_apply


@contextlib.contextmanager
def variables_restored_on_error(model):
    """Runs a Keras `fit` / `evaluate` / `predict` of `model` so that an
    exception in the middle (a bad batch from a preprocessor) leaves the
    model usable.

    On JAX, Keras detaches every variable's value while those loops run (the
    compiled steps take the state as arguments and donate it) and reattaches
    the latest state at the end; an exception in between would leave the
    variables empty. Here the latest state Keras kept (`_jax_state`) is put
    back, and variables the loop had not reached yet get the value they had
    before the call (references, not copies: buffers the loop donated are
    not held). Other backends keep their variables attached.
    """
    if backend_name() != "jax":
        yield
        return
    optimizer = getattr(model, "optimizer", None)
    variables = [
        *model.trainable_variables,
        *model.non_trainable_variables,
        *(optimizer.variables if optimizer is not None else ()),
        *model.metrics_variables,
    ]
    before = [(variable, variable._value) for variable in variables]
    try:
        yield
    except BaseException:
        if getattr(model, "_jax_state", None):
            model.jax_state_sync()
        for variable, value in before:
            if variable._value is None:
                variable._value = value
        model._jax_state = None
        raise


def relaxes_traced_shapes():
    """Whether Keras' compiled `fit` / `evaluate` / `predict` functions on
    this backend generalise to unknown dimensions once they see a second
    input shape: TensorFlow's `tf.function(reduce_retracing=True)` then
    traces with the sequence length `None`. (JAX compiles per shape; torch
    runs eagerly.)"""
    return backend_name() == "tensorflow"


def batches_of_any_width(batches):
    """`batches` (a `keras.utils.PyDataset` whose batches may differ in
    width, e.g. text padded per batch to a bucket length) in a form this
    backend's `fit` / `evaluate` / `predict` take whatever the widths.

    On TensorFlow, Keras' `PyDataset` adapter fixes every array's shape from
    the first two batches (keras-team/keras#19124), so a later, wider batch
    is refused. There the batches become a `tf.data.Dataset` (of the same
    length, calling the dataset's epoch hooks) whose arrays of rank 2
    (token ids, masks, segment ids, per-token weights) have their second
    axis unknown too; arrays of other ranks keep their shapes but the batch
    axis. Elsewhere `batches` is returned as it is.
    """
    if backend_name() != "tensorflow":
        return batches
    import tensorflow as tf

    def spec(array):
        array = np.asarray(array)
        shape = (None, None) if array.ndim == 2 else (None, *array.shape[1:])
        return tf.TensorSpec(shape, tf.as_dtype(array.dtype))

    def generate():
        batches.on_epoch_begin()
        for index in range(len(batches)):
            yield batches[index]
        batches.on_epoch_end()

    signature = tf.nest.map_structure(spec, batches[0])
    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.apply(tf.data.experimental.assert_cardinality(len(batches)))


def supports_custom_gradients():
    """Whether `custom_gradient_from_outputs` works on this backend."""
    return backend_name() in ("jax", "tensorflow", "torch")


def seeded_global_random(seed):
    """A context in which the backend's own global random generator, if
    library code draws from it, is seeded from `seed` (a Keras seed, an
    integer tensor of shape `(2,)`), and restored afterwards.

    Only torch has such a draw: `native_fused_attention` lets
    `scaled_dot_product_attention` drop out with torch's generator. Running
    the same computation twice under the same `seed` (as a reversible
    layer's recomputation does) then drops the same entries. Elsewhere all
    randomness goes through Keras seeds and this does nothing.
    """
    if backend_name() != "torch":
        return contextlib.nullcontext()
    return _torch_seeded_global_random(seed)


@contextlib.contextmanager
def _torch_seeded_global_random(seed):
    import torch

    words = [int(word) & 0xFFFFFFFF for word in keras.ops.convert_to_numpy(seed).reshape(-1)[:2]]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed((words[0] << 32) | words[1])
        yield
