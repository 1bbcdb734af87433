"""The forward pass of `predict`, `evaluate` and their `*_on_batch` as one
recorded program per input shape on torch.

Keras runs a torch model eagerly: every layer call goes through Keras'
Python machinery (name scopes, dtype policies, masking, input checks), which
for a small model or a small batch costs more than its matrix products (a
4-layer, 128-wide BERT at batch 1: about 9 ms of dispatch against 2 ms for
`transformers`). JAX and TensorFlow compile `predict` whole; on torch this
mixin records the forward pass once per input signature with
`backend_support.compile_step` (`torch.jit.trace`; the weights are inputs of
the recording, so later training is seen, and variables the forward pass
assigns, such as Transformer-XL's stream memory, are assigned after each
replay) and replays it, so a `predict` over many batches pays Keras'
dispatch once per shape bucket instead of once per batch. Bucketed padding
(`TextPreprocessor`) keeps the shapes few. A forward pass that draws random
numbers at inference (the Reformer's LSH rotations without a `hash_seed`)
runs eagerly.

Eager calls (`model(x)`) are unchanged, and so is every step on JAX and
TensorFlow.
"""

import logging

import keras

from attention_zoo_keras import backend_support

logger = logging.getLogger("attention_zoo_keras")


class TracedInference:
    """Mixin for `keras.Model`s: on torch, `predict_step` and `test_step`
    replay a recorded forward pass (`training=False`) per input signature.

    `traced_signatures` lists the input signatures recorded so far (one
    program each); a new one is logged at INFO on the `attention_zoo_keras`
    logger. When Keras makes its predict or test function anew (after
    `compile()`, for instance) the recordings start afresh.

    Example:

    >>> import logging
    >>> logging.getLogger("attention_zoo_keras").setLevel(logging.INFO)  # doctest: +SKIP
    >>> classifier.predict(texts)          # one recording per bucket width  # doctest: +SKIP
    >>> len(classifier.traced_signatures)  # e.g. 2 on torch, 0 elsewhere   # doctest: +SKIP
    """

    @property
    def traced_signatures(self):
        """The input signatures whose forward pass is recorded (torch only)."""
        forward = self.__dict__.get("_traced_forward")
        return [] if forward is None else list(forward.signatures)

    def _inference_forward(self):
        """The recorded `self(x, training=False)` (kept out of Keras'
        attribute tracking)."""
        forward = self.__dict__.get("_traced_forward")
        if forward is None:
            name = type(self).__name__

            def announce(signature):
                shapes = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in signature[1])
                logger.info("%s: recording the forward pass for inputs %s (once per input shape).", name, shapes)

            forward = backend_support.compile_step(
                lambda x: self(x, training=False), self.variables, on_new_signature=announce
            )
            self.__dict__["_traced_forward"] = forward
        return forward

    def make_predict_function(self, force=False):
        if force or self.predict_function is None:
            self._forget_recordings()
        return super().make_predict_function(force)

    def make_test_function(self, force=False):
        if force or self.test_function is None:
            self._forget_recordings()
        return super().make_test_function(force)

    def _forget_recordings(self):
        """Keras makes its predict / test function anew after `compile()`
        or when the model's state changes shape (Transformer-XL's
        `reset_memory` for another number of streams): record anew too,
        with the model's variables as they are now."""
        self.__dict__["_traced_forward"] = None

    def predict_step(self, *args):
        """Keras' `predict_step`; on torch, its forward pass replayed."""
        if backend_support.backend_name() != "torch":
            return super().predict_step(*args)
        (data,) = args
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self._inference_forward()(x)

    def test_step(self, *args):
        """Keras' `test_step`; on torch, its forward pass replayed, with the
        loss and metrics computed eagerly on the outputs."""
        if backend_support.backend_name() != "torch":
            return super().test_step(*args)
        (data,) = args
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self._inference_forward()(x)
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
        batch_size = next(value for value in keras.tree.flatten(x) if value is not None).shape[0]
        self._loss_tracker.update_state(loss, sample_weight=batch_size)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
