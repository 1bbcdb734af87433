"""ReversibleSequence (Reformer §3) against ordinary residuals on the active
backend: forward values, gradients of training calls (recomputed) with
respect to the inputs and every weight, a `model.fit` step, dropout
reproduced in the recomputation, the memory a training step needs as the
stack deepens, and inference calls that draw nothing."""

import gc
import json
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.layers import FeedForward
from attention_zoo_keras.layers import MultiHeadAttention
from attention_zoo_keras.layers.reversible import ReversibleSequence

BACKEND = keras.backend.backend()
ROOT = pathlib.Path(__file__).resolve().parents[2]
BATCH, LENGTH, HIDDEN = 2, 6, 8
PADDING = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)[:, None, :]


@keras.saving.register_keras_serializable(package="tests_reversible")
class AttentionBranch(keras.layers.Layer):
    """`F`: pre-norm self-attention with dropout on its output, as in the Reformer."""

    def __init__(self, dropout=0.0, attention_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.attention = MultiHeadAttention(num_heads=2, head_dim=4, dropout=attention_dropout, name="attention")
        self.output_dropout = keras.layers.Dropout(dropout, name="output_dropout")

    def build(self, input_shape):
        self.norm.build(input_shape)
        self.attention.build(input_shape)

    def call(self, x, attention_mask=None, is_causal=False, training=None):
        attended = self.attention(self.norm(x), attention_mask=attention_mask, is_causal=is_causal, training=training)
        return self.output_dropout(attended, training=training)

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout, "attention_dropout": self.attention_dropout}


def feed_forward_branch(dropout=0.0):
    """`G`: pre-norm feed-forward network with dropout (a `Sequential`)."""
    return keras.Sequential(
        [keras.layers.LayerNormalization(), FeedForward(16, activation="gelu"), keras.layers.Dropout(dropout)]
    )


def make_blocks(num_layers=3, dropout=0.0, attention_dropout=0.0, seed=0):
    keras.utils.set_random_seed(seed)
    blocks = [
        (AttentionBranch(dropout, attention_dropout), feed_forward_branch(dropout)) for _ in range(num_layers)
    ]
    for f, g in blocks:
        f.build((None, None, HIDDEN))
        g.build((None, None, HIDDEN))
    # Move every weight off its initial value, so no bias is 0 and no norm is the identity.
    rng = np.random.default_rng(seed)
    for f, g in blocks:
        for variable in f.weights + g.weights:
            variable.assign(variable.numpy() + 0.1 * rng.standard_normal(variable.shape).astype("float32"))
    return blocks


def plain_residuals(blocks, x1, x2, training=False, **f_kwargs):
    """The formula, with ordinary residuals (every activation stored)."""
    x1, x2 = keras.ops.convert_to_tensor(x1), keras.ops.convert_to_tensor(x2)
    for f, g in blocks:
        x1 = x1 + f(x2, training=training, **f_kwargs)
        x2 = x2 + g(x1, training=training)
    return x1, x2


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def inputs(seed=1, shape=(BATCH, LENGTH, HIDDEN)):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def gradients(loss_fn, x, variables):
    """`(d loss / d x, [d loss / d v for v in variables])` by the backend's own
    autodiff, on the variables themselves: TensorFlow's tape and torch's
    autograd reach them as they do in `fit`; JAX differentiates a stateless
    call (the variables' values mapped by a `StatelessScope`), as Keras'
    JAX trainer does."""
    if BACKEND == "jax":
        import jax

        def stateless(values, x):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return loss_fn(x)

        value_grads, x_grad = jax.grad(stateless, argnums=(0, 1))([v.value for v in variables], x)
        return np.asarray(x_grad), [np.asarray(g) for g in value_grads]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = loss_fn(x)
        grads = tape.gradient(loss, [x] + list(variables))
        return grads[0].numpy(), [g.numpy() for g in grads[1:]]
    if BACKEND == "torch":
        import torch

        x = torch.tensor(x, requires_grad=True)
        loss = loss_fn(x)
        grads = torch.autograd.grad(loss, [x] + [v.value for v in variables])
        return grads[0].numpy(), [g.numpy() for g in grads[1:]]
    pytest.skip(f"no autodiff on {BACKEND}")


def weighted_sum(y1, y2):
    """A loss whose cotangents differ at every position of both streams."""
    r1, r2 = keras.ops.convert_to_tensor(inputs(7)), keras.ops.convert_to_tensor(inputs(8))
    return keras.ops.sum(y1 * r1) + keras.ops.sum(keras.ops.tanh(y2) * r2)


# --- forward ------------------------------------------------------------------


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("recompute", [True, False])
def test_forward_is_the_formula(recompute, training):
    blocks = make_blocks()
    stack = ReversibleSequence(blocks, recompute=recompute)
    x = inputs()
    y1, y2 = stack(x, attention_mask=PADDING, training=training)
    expected1, expected2 = plain_residuals(blocks, x, x, attention_mask=PADDING)
    np.testing.assert_allclose(numpy(y1), numpy(expected1), atol=1e-6)
    np.testing.assert_allclose(numpy(y2), numpy(expected2), atol=1e-6)


def test_two_streams_in_and_extra_branch_arguments():
    blocks = make_blocks(2)
    stack = ReversibleSequence(blocks)
    x1, x2 = inputs(1), inputs(2)
    y1, y2 = stack((x1, x2), f_kwargs={"is_causal": True})
    expected1, expected2 = plain_residuals(blocks, x1, x2, is_causal=True)
    np.testing.assert_allclose(numpy(y1), numpy(expected1), atol=1e-6)
    np.testing.assert_allclose(numpy(y2), numpy(expected2), atol=1e-6)


def test_recomputes_on_every_backend_with_custom_gradients():
    stack = ReversibleSequence(make_blocks(1))
    assert stack.recomputes == (BACKEND in ("jax", "tensorflow", "torch"))
    assert not ReversibleSequence(make_blocks(1), recompute=False).recomputes


# --- gradients ----------------------------------------------------------------


def test_gradients_match_stored_residuals():
    """d/dx and d/d(every weight) of a 3-layer stack's training call (no
    dropout), recomputed in the backward pass, against the same network with
    ordinary residuals."""
    blocks = make_blocks(3)
    stack = ReversibleSequence(blocks)
    x = inputs()
    stack(x)  # builds
    variables = stack.trainable_variables
    assert len(variables) == 3 * (2 + 8 + 2 + 4)  # per layer: F: norm, q/k/v/o; G: norm, FFN

    ours = gradients(lambda x: weighted_sum(*stack(x, attention_mask=PADDING, training=True)), x, variables)
    reference = gradients(
        lambda x: weighted_sum(*plain_residuals(blocks, x, x, attention_mask=PADDING)), x, variables
    )
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4, atol=1e-5)
    for variable, got, expected in zip(variables, ours[1], reference[1]):
        if not variable.path.endswith("key/bias"):  # (softmax ignores it: zero gradient)
            assert np.abs(expected).max() > 1e-3, variable.path
        # float32 sums in another order (recomputed vs stored) differ by ~1e-5.
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=5e-5, err_msg=variable.path)


def test_frozen_branch_gets_no_gradient_and_the_rest_still_match():
    blocks = make_blocks(2)
    blocks[0][0].trainable = False
    stack = ReversibleSequence(blocks)
    x = inputs()
    stack(x)
    variables = stack.trainable_variables
    assert not any(v is w for v in variables for w in blocks[0][0].weights)
    ours = gradients(lambda x: weighted_sum(*stack(x, training=True)), x, variables)
    reference = gradients(lambda x: weighted_sum(*plain_residuals(blocks, x, x)), x, variables)
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4, atol=1e-5)
    for got, expected in zip(ours[1], reference[1]):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_weights_shared_between_layers_sum_their_gradients():
    (f, g), = make_blocks(1)
    blocks = [(f, g), (f, g)]  # one pair of branches applied twice (ALBERT-style sharing)
    stack = ReversibleSequence(blocks)
    x = inputs()
    stack(x)
    variables = stack.trainable_variables
    assert len(variables) == len(f.trainable_weights) + len(g.trainable_weights)
    ours = gradients(lambda x: weighted_sum(*stack(x, training=True)), x, variables)
    reference = gradients(lambda x: weighted_sum(*plain_residuals(blocks, x, x)), x, variables)
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4, atol=1e-5)
    for got, expected in zip(ours[1], reference[1]):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_dropout_is_reproduced_in_the_recomputation():
    """With dropout on (in both branches and on the attention probabilities),
    the recomputing backward pass must see the forward pass's masks: its
    gradients then equal those of ordinary residuals run with the same seeds
    (`recompute=False`, same `seed`). A different mask in the recomputation
    would rebuild wrong inputs and give different gradients."""
    blocks = make_blocks(3, dropout=0.3, attention_dropout=0.2)
    reversible = ReversibleSequence(blocks, seed=11)
    stored = ReversibleSequence(blocks, recompute=False, seed=11)
    x = inputs()
    reversible(x)
    stored(x)  # builds (an inference call draws no seeds)
    variables = reversible.trainable_variables

    def loss(stack):
        return lambda x: weighted_sum(*stack(x, attention_mask=PADDING, training=True))

    ours, reference = gradients(loss(reversible), x, variables), gradients(loss(stored), x, variables)
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4, atol=1e-5)
    for variable, got, expected in zip(variables, ours[1], reference[1]):
        # As above: recomputed and stored activations sum in another order
        # (JAX 0.10 on a CPU: 1.4e-5 on a weight gradient of magnitude 5). A
        # wrong dropout mask would be off by the gradient's own size.
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=5e-5, err_msg=variable.path)

    # Dropout is really on, and draws new masks at every call.
    train_a = numpy(reversible(x, training=True)[0])
    train_b = numpy(reversible(x, training=True)[0])
    inference = numpy(reversible(x, training=False)[0])
    assert not np.allclose(train_a, inference)
    assert not np.allclose(train_a, train_b)


def test_inference_draws_nothing_and_has_the_gradients_of_stored_residuals():
    """At inference there is no dropout to replay: the stack draws no seeds
    (its generator keeps its state, so it traces and exports as plain
    operations), and a gradient taken through it is that of ordinary
    residuals."""
    blocks = make_blocks(2, dropout=0.3, attention_dropout=0.2)
    stack = ReversibleSequence(blocks, seed=3)
    x = inputs()
    stack(x)  # builds
    state = numpy(stack.seed_generator.state).copy()
    y1, _ = stack(x, attention_mask=PADDING)
    np.testing.assert_array_equal(numpy(stack.seed_generator.state), state)
    np.testing.assert_allclose(numpy(y1), numpy(plain_residuals(blocks, x, x, attention_mask=PADDING)[0]), atol=1e-6)

    variables = stack.trainable_variables
    ours = gradients(lambda x: weighted_sum(*stack(x, attention_mask=PADDING)), x, variables)
    reference = gradients(
        lambda x: weighted_sum(*plain_residuals(blocks, x, x, attention_mask=PADDING)), x, variables
    )
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-5, atol=1e-6)
    for got, expected in zip(ours[1], reference[1]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --- model.fit ------------------------------------------------------------------


def reversible_model(blocks, recompute=True, seed=None):
    x = keras.Input((LENGTH, HIDDEN))
    stack = ReversibleSequence(blocks, recompute=recompute, seed=seed, name="reversible")
    y1, y2 = stack(x, f_kwargs={"is_causal": True})
    logits = keras.layers.Dense(3, name="head")(keras.ops.concatenate([y1, y2], axis=-1))
    return keras.Model(x, logits)


def plain_model(blocks):
    x = keras.Input((LENGTH, HIDDEN))
    y1, y2 = x, x
    for f, g in blocks:
        y1 = y1 + f(y2, is_causal=True)
        y2 = y2 + g(y1)
    logits = keras.layers.Dense(3, name="head")(keras.ops.concatenate([y1, y2], axis=-1))
    return keras.Model(x, logits)


def one_sgd_step(model):
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x = inputs(3, (4, LENGTH, HIDDEN))
    targets = inputs(4, (4, LENGTH, 3))
    model.fit(x, targets, batch_size=4, epochs=1, shuffle=False, verbose=0)


def test_fit_step_matches_the_plain_model():
    """One SGD step of `fit`: the reversible model's weights move exactly as
    those of the same network written with ordinary residuals."""
    our_blocks, their_blocks = make_blocks(3), make_blocks(3)
    ours, theirs = reversible_model(our_blocks), plain_model(their_blocks)
    pairs = [(ours.get_layer("head"), theirs.get_layer("head"))]
    for (our_f, our_g), (their_f, their_g) in zip(our_blocks, their_blocks):
        pairs += [(our_f, their_f), (our_g, their_g)]
    for our_layer, their_layer in pairs:
        their_layer.set_weights(our_layer.get_weights())
    initial = [[np.array(w) for w in layer.get_weights()] for layer, _ in pairs]

    one_sgd_step(ours)
    one_sgd_step(theirs)
    for (our_layer, their_layer), before in zip(pairs, initial):
        for variable, after, start, expected in zip(
            our_layer.weights, our_layer.get_weights(), before, their_layer.get_weights()
        ):
            if not variable.path.endswith("key/bias"):  # (softmax ignores it: zero gradient)
                assert not np.allclose(after, start), variable.path  # every weight moved
            np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-5, err_msg=variable.path)


def test_fit_step_with_dropout_matches_stored_residuals():
    ours = reversible_model(make_blocks(2, dropout=0.3, attention_dropout=0.2), seed=5)
    theirs = reversible_model(make_blocks(2, dropout=0.3, attention_dropout=0.2), recompute=False, seed=5)
    theirs.set_weights(ours.get_weights())
    one_sgd_step(ours)
    one_sgd_step(theirs)
    for variable, after, expected in zip(ours.weights, ours.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-5, err_msg=variable.path)


# --- memory -------------------------------------------------------------------

MEMORY_SHAPE = (8, 256, 16)
ACTIVATION_BYTES = int(np.prod(MEMORY_SHAPE)) * 4


def _memory_stack(num_layers, recompute):
    keras.utils.set_random_seed(0)
    blocks = [(keras.layers.Dense(16, activation="tanh"), FeedForward(32)) for _ in range(num_layers)]
    stack = ReversibleSequence(blocks, recompute=recompute)
    stack.build(MEMORY_SHAPE)
    return stack


def _gradient_bytes(num_layers):
    """The bytes of the weights' gradients, which a step returns (TensorFlow's
    allocator peak counts them)."""
    return sum(int(np.prod(v.shape)) * 4 for v in _memory_stack(num_layers, True).trainable_variables)


def training_memory(num_layers, recompute):
    """Bytes a gradient step of a `num_layers` stack needs, measured on CPU
    by the backend itself:

    * JAX: XLA's temporary buffers of the compiled gradient function
      (`compiled.memory_analysis().temp_size_in_bytes`), i.e. the peak of
      its scratch memory beside arguments and outputs.
    * TensorFlow: the CPU allocator's peak during one call of an
      XLA-compiled `tf.function` gradient step
      (`tf.config.experimental.get_memory_info`), less what was allocated
      before.
    * torch: the bytes of the tensors autograd saves for the backward pass
      (`torch.autograd.graph.saved_tensors_hooks`, distinct storages, weights
      excluded) -- the memory held between forward and backward. torch has
      no CPU allocator statistics.
    """
    stack = _memory_stack(num_layers, recompute)
    x = inputs(0, MEMORY_SHAPE)

    def loss(x):
        y1, y2 = stack(x, training=True)
        return keras.ops.sum(y1 * y2)

    if BACKEND == "jax":
        import jax

        non_trainable = [v.value for v in stack.non_trainable_variables]

        def stateless_loss(trainable, x):
            (y1, y2), _ = stack.stateless_call(trainable, non_trainable, x, training=True)
            return keras.ops.sum(y1 * y2)

        trainable = [v.value for v in stack.trainable_variables]
        compiled = jax.jit(jax.grad(stateless_loss, argnums=(0, 1))).lower(trainable, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes
    if BACKEND == "tensorflow":
        import tensorflow as tf

        # XLA, as `fit` compiles it by default: it runs the ops in one fixed
        # order. (TensorFlow's graph executor runs independent ops in parallel,
        # and its peak then varies from run to run by a few activations.)
        @tf.function(jit_compile=True)
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = loss(x)
            return tape.gradient(value, [x] + stack.trainable_variables)

        x = tf.constant(x)
        step(x)  # trace
        peaks = []
        # The least of three calls (see `training_memories` for why in a
        # process of its own).
        for _ in range(3):
            gc.collect()  # no tensors of earlier calls freed (and counted) during the step
            tf.config.experimental.reset_memory_stats("CPU:0")
            before = tf.config.experimental.get_memory_info("CPU:0")["current"]
            step(x)
            peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
        return min(peaks)
    if BACKEND == "torch":
        import torch

        weights = {v.value.untyped_storage().data_ptr() for v in stack.variables}
        saved = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in weights:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        x = torch.tensor(x, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            value = loss(x)
        value.backward()
        return sum(saved.values())
    pytest.skip(f"no autodiff on {BACKEND}")


def training_memories():
    """`training_memory` of 2 and 8 layers, stored and recomputed:
    `{"stored": {2: bytes, 8: bytes}, "recomputed": {...}}`.

    On TensorFlow the measurements run in a fresh Python process: the CPU
    allocator's peak counts every thread of the process, and in a full CI
    run something else in the test worker allocated 1.8 MB during all three
    measured calls (alone, the measurement varies by under 0.1 MB from run
    to run).
    """
    if BACKEND != "tensorflow":
        return _training_memories_in_this_process()
    code = "import json, tests.layers.test_reversible as t; print(json.dumps(t._training_memories_in_this_process()))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    measured = json.loads(run.stdout.splitlines()[-1])
    return {kind: {int(depth): size for depth, size in sizes.items()} for kind, sizes in measured.items()}


def _training_memories_in_this_process():
    return {
        kind: {depth: training_memory(depth, recompute=kind == "recomputed") for depth in (2, 8)}
        for kind in ("stored", "recomputed")
    }


def test_training_memory_does_not_grow_with_depth_when_recomputing():
    if not backend_support.supports_custom_gradients():
        pytest.skip(f"no recomputation on {BACKEND}")
    memories = training_memories()
    stored, recomputed = memories["stored"], memories["recomputed"]
    # The measurement sees activations: ordinary residuals keep several per layer.
    assert stored[8] - stored[2] >= 6 * 4 * ACTIVATION_BYTES, stored
    # Recomputation keeps the last outputs only, whatever the depth (the
    # allowance is for allocator noise, under a third of an activation a
    # layer, and for the six more layers' weight gradients, which a step returns).
    allowance = 2 * ACTIVATION_BYTES + _gradient_bytes(8) - _gradient_bytes(2)
    assert recomputed[8] <= recomputed[2] + allowance, (recomputed, allowance)
    assert recomputed[8] < stored[2]
    if BACKEND == "torch":  # exactly (Y1, Y2) and the per-branch seeds
        assert 2 * ACTIVATION_BYTES <= recomputed[8] < 2 * ACTIVATION_BYTES + 1024


# --- construction and serialization ---------------------------------------------


def test_config_round_trip_rebuilds_the_same_function():
    stack = ReversibleSequence(make_blocks(2, dropout=0.1), recompute=False, seed=3, name="rev")
    x = inputs()
    expected = stack(x, attention_mask=PADDING)
    rebuilt = ReversibleSequence.from_config(stack.get_config())
    rebuilt.build(x.shape)
    rebuilt.set_weights(stack.get_weights())
    assert rebuilt.get_config() == stack.get_config()
    assert rebuilt.recompute is False and rebuilt.seed == 3
    for got, want in zip(rebuilt(x, attention_mask=PADDING), expected):
        np.testing.assert_allclose(numpy(got), numpy(want), atol=1e-6)


def test_saved_model_reloads(tmp_path):
    model = reversible_model(make_blocks(2))
    x = inputs(3, (4, LENGTH, HIDDEN))
    expected = numpy(model(x))
    model.save(tmp_path / "reversible.keras")
    reloaded = keras.saving.load_model(tmp_path / "reversible.keras")
    assert isinstance(reloaded.get_layer("reversible"), ReversibleSequence)
    np.testing.assert_allclose(numpy(reloaded(x)), expected, atol=1e-6)


def test_a_branch_that_updates_state_is_rejected():
    blocks = [(keras.layers.Dense(HIDDEN), keras.layers.BatchNormalization())]
    with pytest.raises(ValueError, match="must not update state"):
        ReversibleSequence(blocks)(inputs(), training=True)


def test_blocks_must_be_pairs_of_layers():
    with pytest.raises(ValueError, match="at least one"):
        ReversibleSequence([])
    with pytest.raises(ValueError, match="pair"):
        ReversibleSequence([(keras.layers.Dense(2),)])
