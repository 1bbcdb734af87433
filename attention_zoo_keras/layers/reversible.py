"""Reversible residual layers (Gomez et al., 2017, "The Reversible Residual
Network"; Kitaev et al., 2020, "Reformer: The Efficient Transformer", §3).

The activations are split into two streams. Each layer `i` has an
attention-like branch `F_i` and a feed-forward-like branch `G_i`:

    Y1 = X1 + F(X2)
    Y2 = X2 + G(Y1)

and its inputs are recovered exactly from its outputs:

    X2 = Y2 - G(Y1)
    X1 = Y1 - F(X2)

so backpropagation through `N` layers needs the activations of one layer at
a time rather than of all `N`: the backward pass keeps only the last
layer's outputs `(Y1, Y2)` and, walking the layers in reverse, recomputes
`G(Y1)` and `F(X2)` to rebuild each layer's inputs and take its gradients.
The Reformer feeds its hidden states `h` in as both streams (`X1 = X2 = h`)
and normalises the concatenation `[Y1; Y2]` (width `2·d`) afterwards
(Hugging Face `transformers`: `ReformerEncoder`, `_ReversibleFunction`).

Which backends recompute: JAX (`jax.custom_vjp`), TensorFlow
(`tf.custom_gradient`) and PyTorch (`torch.autograd.Function`), through
`backend_support.custom_gradient_from_outputs`; any other backend runs the
same forward pass with ordinary residuals (activations stored). Calls at
inference (`training` false or unset) run ordinary residuals on every
backend: there is no dropout to replay and, as a rule, no backward pass.
"""

import contextlib
import inspect

import keras
import numpy as np

from attention_zoo_keras import backend_support
from attention_zoo_keras.registration import register


class _Plan:
    """The variables and seed generators of the branches, and which of them
    each branch reads. Built afresh at every call (cheap), so a change of
    `trainable` is always seen."""

    def __init__(self, blocks):
        self.variables = []
        self.generators = []
        # Per block (f_entry, g_entry); an entry is (layer, its variables' and
        # seed generators' indices, whether it takes `training`, branch index).
        self.entries = []
        variable_index, generator_index = {}, {}
        for pair in blocks:
            entries = []
            for layer in pair:
                generators = []
                for sublayer in layer._flatten_layers(include_self=True):
                    generators.extend(getattr(sublayer, "_seed_generators", []))
                seed_states = {id(generator.state) for generator in generators}
                var_ids = []
                for variable in layer.variables:
                    if id(variable) in seed_states:
                        continue
                    if id(variable) not in variable_index:
                        variable_index[id(variable)] = len(self.variables)
                        self.variables.append(variable)
                    var_ids.append(variable_index[id(variable)])
                gen_ids = []
                for generator in generators:
                    if id(generator) not in generator_index:
                        generator_index[id(generator)] = len(self.generators)
                        self.generators.append(generator)
                    gen_ids.append(generator_index[id(generator)])
                takes_training = "training" in inspect.signature(layer.call).parameters
                branch = len(self.entries) * 2 + len(entries)
                entries.append(
                    (layer, tuple(dict.fromkeys(var_ids)), tuple(dict.fromkeys(gen_ids)), takes_training, branch)
                )
            self.entries.append(tuple(entries))
        self.trainable = [i for i, v in enumerate(self.variables) if v.trainable]
        self.frozen = [i for i, v in enumerate(self.variables) if not v.trainable]
        # One seed per seed generator, then one per branch for the backend's
        # global generator (see `backend_support.seeded_global_random`).
        self.num_seeds = len(self.generators) + 2 * len(self.entries)


@register
class ReversibleSequence(keras.layers.Layer):
    """A stack of reversible residual layers, `Y1 = X1 + F(X2)`,
    `Y2 = X2 + G(Y1)`, whose backward pass recomputes activations instead
    of storing them.

    Memory: with `recompute=True` on JAX, TensorFlow and PyTorch, a training
    call (`training=True`) keeps the final `(Y1, Y2)` for the backward pass
    (plus whatever one layer needs while its gradient is taken), whatever the
    number of layers; the price is one more forward pass of every `F` and `G`
    (the activations held for a gradient step, measured in
    `tests/layers/test_reversible.py`, stay flat from 2 to 8 layers, where
    stored residuals grow about linearly). Gradients reach the branches'
    weights (`model.fit`, `GradientTape`, `jax.grad` of a `stateless_call`,
    `loss.backward()` alike). On other backends, and with `recompute=False`,
    the same function is computed with ordinary residuals.

    Inference (`training` false or unset) computes the same function with
    ordinary residuals, the branches called as they are (on their variables
    and their own seed generators): it draws no seeds and has no custom
    gradient, so it traces and exports (`model.export`) as plain operations;
    gradients of such a call, if taken, are those of stored residuals.

    Randomness: every training call draws one seed per seed generator of
    the branches (e.g. per `Dropout`, per `MultiHeadAttention`) from this
    layer's own generator (`seed`), and the branches run with those seeds in
    the forward pass and again in the recomputation, so dropout masks agree.
    Under torch, where the fused attention drops out with torch's global
    generator (`backend_support.native_fused_attention`), each branch also
    runs with that generator seeded from a per-call seed of its own, and
    restored afterwards (`backend_support.seeded_global_random`). Both modes
    use the same seeds: with the same `seed`, `recompute=True` and
    `recompute=False` compute the same values and gradients, dropout
    included.

    Requirements on the branches: `F` and `G` map `(batch, length, d)` to
    the same shape; they read only their own variables (`layer.variables`);
    they update no variable (no `BatchNormalization` statistics; seed
    generators excepted) and add no losses (`add_loss`, activity
    regularizers) -- both would be lost in the recomputation, so updates
    raise an error; randomness goes through Keras seed generators (layers'
    own, as `Dropout` has), not Keras' global one (`seed=None` in
    `keras.random` calls). The branches are built with `build(input_shape)`
    if not yet built.

    Args:
        blocks: list of (keras.layers.Layer, keras.layers.Layer). The
            `(F, G)` pairs: `F` attention-like (it receives
            `attention_mask` and `f_kwargs`), `G` feed-forward-like (it
            receives `g_kwargs`). Both receive `training` if their `call`
            takes it.
        recompute: bool. `True` to save memory by recomputation in training
            calls where the backend allows it; `False` for ordinary
            residuals (activations stored).
        seed: int or None. The seed of the branches' randomness (dropout).

    Call args:
        inputs: tensor of shape `(batch, length, d)`, or a pair of them.
            One tensor is used as both `X1` and `X2` (as the Reformer
            does); a pair is `(x1, x2)`.
        attention_mask: tensor or None. Passed to every `F` as
            `attention_mask`.
        training: bool or None. Passed to every branch that takes it.
        f_kwargs: dict or None. Further keyword arguments of every `F`
            (tensors or Python values).
        g_kwargs: dict or None. Likewise for every `G`.

    Returns:
        The pair `(Y1, Y2)` after the last layer; the Reformer concatenates
        them along the features (`keras.ops.concatenate([y1, y2], -1)`).

    Example:

    >>> import numpy as np
    >>> blocks = [(keras.layers.Dense(8), keras.layers.Dense(8)) for _ in range(3)]
    >>> stack = ReversibleSequence(blocks)
    >>> y1, y2 = stack(np.ones((2, 5, 8), "float32"))
    >>> tuple(y1.shape), tuple(y2.shape)
    ((2, 5, 8), (2, 5, 8))
    """

    def __init__(self, blocks, recompute=True, seed=None, **kwargs):
        super().__init__(**kwargs)
        blocks = [tuple(pair) for pair in blocks]
        if not blocks:
            raise ValueError("ReversibleSequence needs at least one (F, G) pair.")
        for pair in blocks:
            if len(pair) != 2 or not all(isinstance(layer, keras.layers.Layer) for layer in pair):
                raise ValueError(f"Each block must be a pair (F, G) of Keras layers; received {pair!r}.")
        self.recompute = recompute
        self.seed = seed
        # Tracked lists, so the branches' weights are this layer's weights.
        self.f_layers = [pair[0] for pair in blocks]
        self.g_layers = [pair[1] for pair in blocks]
        self.seed_generator = keras.random.SeedGenerator(seed)

    @property
    def blocks(self):
        """The `(F, G)` pairs."""
        return list(zip(self.f_layers, self.g_layers))

    @property
    def recomputes(self):
        """Whether the backward pass of a training call recomputes
        activations here (`recompute` set and the backend supports custom
        gradients)."""
        return bool(self.recompute) and backend_support.supports_custom_gradients()

    def build(self, input_shape):
        shape = self._stream_shape(input_shape)
        for layer in self.f_layers + self.g_layers:
            if not layer.built:
                layer.build(shape)

    @staticmethod
    def _is_pair(inputs_or_shape):
        return isinstance(inputs_or_shape, (list, tuple)) and len(inputs_or_shape) == 2 and not all(
            dim is None or isinstance(dim, int) for dim in inputs_or_shape
        )

    def _stream_shape(self, input_shape):
        return tuple(input_shape[0]) if self._is_pair(input_shape) else tuple(input_shape)

    def compute_output_shape(self, input_shape):
        if self._is_pair(input_shape):
            return tuple(input_shape[0]), tuple(input_shape[1])
        return tuple(input_shape), tuple(input_shape)

    # -- the computation ---------------------------------------------------

    @staticmethod
    def _branch(plan, entry, x, values, seeds, kwargs, training):
        """One branch, run statelessly on the given weight values and seeds."""
        layer, var_ids, gen_ids, takes_training, branch = entry
        mapping = [(plan.variables[i], values[i]) for i in var_ids]
        mapping += [(plan.generators[j].state, seeds[j]) for j in gen_ids]
        call_kwargs = dict(kwargs)
        if takes_training:
            call_kwargs["training"] = training
        global_random = (
            backend_support.seeded_global_random(seeds[len(plan.generators) + branch])
            if training
            else contextlib.nullcontext()
        )
        with keras.StatelessScope(state_mapping=mapping) as scope, global_random:
            before = [scope.get_current_value(plan.variables[i]) for i in var_ids]
            output = layer(x, **call_kwargs)
        for i, value in zip(var_ids, before):
            if scope.get_current_value(plan.variables[i]) is not value:
                raise ValueError(
                    f"{layer.name} updates its variable {plan.variables[i].path} when called; a reversible "
                    "branch must not update state (e.g. BatchNormalization statistics), as the update "
                    "would be lost in the recomputation."
                )
        return output

    @staticmethod
    def _unpack(plan, params, constants, static):
        """All weight values by plan index, the seeds, and the branches' kwargs."""
        values = [None] * len(plan.variables)
        for i, value in zip(plan.trainable, params):
            values[i] = value
        constants = list(constants)
        for i in plan.frozen:
            values[i] = constants.pop(0)
        seeds = constants[: plan.num_seeds]
        tensors = constants[plan.num_seeds :]
        structure, is_tensor, python_leaves = static
        tensors, python_leaves = iter(tensors), iter(python_leaves)
        leaves = [next(tensors) if flag else next(python_leaves) for flag in is_tensor]
        f_kwargs, g_kwargs = keras.tree.pack_sequence_as(structure, leaves)
        return values, seeds, f_kwargs, g_kwargs

    @staticmethod
    def _inference(plan, x1, x2, f_kwargs, g_kwargs, training):
        """`(Y1, Y2)` with ordinary residuals, each branch called on its own
        variables and seed generators (see the class docstring)."""

        def run(entry, x, kwargs):
            layer, _, _, takes_training, _ = entry
            return layer(x, **(dict(kwargs, training=training) if takes_training else kwargs))

        for f_entry, g_entry in plan.entries:
            x1 = x1 + run(f_entry, x2, f_kwargs)
            x2 = x2 + run(g_entry, x1, g_kwargs)
        return x1, x2

    def _forward(self, plan, inputs, params, constants, static, training):
        x1, x2 = inputs
        values, seeds, f_kwargs, g_kwargs = self._unpack(plan, params, constants, static)
        for f_entry, g_entry in plan.entries:
            x1 = x1 + self._branch(plan, f_entry, x2, values, seeds, f_kwargs, training)
            x2 = x2 + self._branch(plan, g_entry, x1, values, seeds, g_kwargs, training)
        return [x1, x2]

    def _backward(self, plan, outputs, params, constants, output_grads, static, training):
        y1, y2 = outputs
        dy1, dy2 = output_grads
        values, seeds, f_kwargs, g_kwargs = self._unpack(plan, params, constants, static)
        position = {index: k for k, index in enumerate(plan.trainable)}
        param_grads = [None] * len(params)

        def step(entry, x, kwargs, cotangent):
            """Recomputes `branch(x)`; returns it, d/dx and accumulates d/dweights."""
            trained = [i for i in entry[1] if i in position]

            def branch(primals):
                substituted = list(values)
                for i, value in zip(trained, primals[1:]):
                    substituted[i] = value
                return self._branch(plan, entry, primals[0], substituted, seeds, kwargs, training)

            output, pullback = backend_support.vjp(branch, [x] + [values[i] for i in trained])
            grads = pullback(cotangent)
            for i, grad in zip(trained, grads[1:]):
                k = position[i]
                param_grads[k] = grad if param_grads[k] is None else param_grads[k] + grad
            return output, grads[0]

        for f_entry, g_entry in reversed(plan.entries):
            g_output, dy1_from_g = step(g_entry, y1, g_kwargs, dy2)
            x2 = y2 - g_output
            dy1 = dy1 + dy1_from_g
            f_output, dx2_from_f = step(f_entry, x2, f_kwargs, dy1)
            x1 = y1 - f_output
            dy2 = dy2 + dx2_from_f
            y1, y2 = x1, x2
        param_grads = [keras.ops.zeros_like(p) if g is None else g for p, g in zip(params, param_grads)]
        return [dy1, dy2], param_grads

    def call(self, inputs, attention_mask=None, training=None, f_kwargs=None, g_kwargs=None):
        if self._is_pair(inputs):
            x1, x2 = inputs
        else:
            x1 = x2 = inputs
        x1 = keras.ops.convert_to_tensor(x1, dtype=self.compute_dtype)
        x2 = keras.ops.convert_to_tensor(x2, dtype=self.compute_dtype)
        plan = _Plan(self.blocks)
        f_kwargs = dict(f_kwargs or {})
        if attention_mask is not None:
            f_kwargs["attention_mask"] = attention_mask
        g_kwargs = dict(g_kwargs or {})
        if not training:
            return self._inference(plan, x1, x2, f_kwargs, g_kwargs, training)

        values = [keras.ops.convert_to_tensor(variable) for variable in plan.variables]
        seeds = [self.seed_generator.next() for _ in range(plan.num_seeds)]
        structure = (f_kwargs, g_kwargs)
        leaves = keras.tree.flatten(structure)
        is_tensor = [keras.ops.is_tensor(leaf) or isinstance(leaf, np.ndarray) for leaf in leaves]
        static = (structure, is_tensor, [leaf for leaf, flag in zip(leaves, is_tensor) if not flag])
        tensors = [keras.ops.convert_to_tensor(leaf) for leaf, flag in zip(leaves, is_tensor) if flag]

        params = [values[i] for i in plan.trainable]
        constants = [values[i] for i in plan.frozen] + seeds + tensors

        def forward(inputs, params, constants):
            return self._forward(plan, inputs, params, constants, static, training)

        def backward(outputs, params, constants, output_grads):
            return self._backward(plan, outputs, params, constants, output_grads, static, training)

        apply = backend_support.custom_gradient_from_outputs(forward, backward) if self.recompute else None
        if apply is None:
            y1, y2 = forward([x1, x2], params, constants)
        else:
            y1, y2 = apply([x1, x2], params, constants)
        return y1, y2

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "blocks": [
                    [keras.saving.serialize_keras_object(f), keras.saving.serialize_keras_object(g)]
                    for f, g in self.blocks
                ],
                "recompute": self.recompute,
                "seed": self.seed,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["blocks"] = [
            tuple(keras.saving.deserialize_keras_object(layer) for layer in pair) for pair in config["blocks"]
        ]
        return cls(**config)

