"""Vector-Jacobian products and custom gradients computed from a layer's
outputs (the reversible layers' recomputation), per backend."""

import keras

from attention_zoo_keras.backend_support.environment import backend_name


def vjp(function, primals):
    """`function(primals)` and its vector-Jacobian product, on this backend.

    Args:
        function: callable. Maps a list of tensors to one tensor.
        primals: list of tensors. The tensors to differentiate with respect
            to.

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
