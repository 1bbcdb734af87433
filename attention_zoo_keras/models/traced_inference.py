"""The forward pass of `predict`, `evaluate` and their `*_on_batch` as one
recorded program per input shape on torch.

Keras runs a torch model eagerly: every layer call goes through Keras'
Python machinery (name scopes, dtype policies, masking, input checks), which
for a small model or a small batch costs more than its matrix products (a
4-layer, 128-wide BERT at batch 1: about 9 ms of dispatch against 2 ms for
`transformers`). JAX and TensorFlow compile `predict` whole; on torch this
mixin records the forward pass once per input signature with
`backend_support.compile_step` (`torch.jit.trace`, the weights passed as
inputs so later training is seen) and replays it, so a `predict` over many
batches pays Keras' dispatch once per shape bucket instead of once per
batch. After `compile(jit_compile=True)` the recorded forward pass is
compiled by TorchInductor instead (slow to compile, fastest to run).
Bucketed padding (`TextPreprocessor`) keeps the shapes few.

Eager calls (`model(x)`) are unchanged.
"""

import logging

import keras

from attention_zoo_keras import backend_support

logger = logging.getLogger("attention_zoo_keras")


class TracedInference:
    """Mixin for `keras.Model`s: on torch, `predict_step` and `test_step`
    replay a recorded forward pass (`training=False`) per input signature.

    `traced_signatures` lists the input signatures recorded so far (one
    program each); a new one is logged at INFO on the
    `attention_zoo_keras` logger.

    Example:

    >>> classifier.predict(texts)          # records one program per bucket width  # doctest: +SKIP
    >>> len(classifier.traced_signatures)  # e.g. 2 on torch, 0 elsewhere         # doctest: +SKIP
    """

    @property
    def traced_signatures(self):
        """The input signatures whose forward pass is recorded (torch only)."""
        forward = self.__dict__.get("_traced_forward")
        return [] if forward is None else list(forward.signatures)

    def _inference_forward(self):
        """The recorded `self(x, training=False)`, made once per compiler:
        TorchInductor after `compile(jit_compile=True)`, else a trace."""
        compiler = "inductor" if self.compiled and self.jit_compile else "trace"
        forward = self.__dict__.get("_traced_forward")
        if forward is None or forward.compiler != compiler:
            name = type(self).__name__

            def announce(signature):
                shapes = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in signature[1])
                logger.info(
                    "%s: recording the forward pass for inputs %s (%s, once per input shape).",
                    name, shapes, "compiled by TorchInductor" if compiler == "inductor" else "torch.jit.trace",
                )

            forward = backend_support.compile_step(
                lambda x: self(x, training=False), self.variables, on_new_signature=announce, compiler=compiler
            )
            forward.compiler = compiler
            self.__dict__["_traced_forward"] = forward
        return forward

    def _made_without_keras_compile(self, make, force):
        """`make(force)` (Keras' `make_predict_function` or
        `make_test_function`) with Keras' own `torch.compile` of the step
        left out under `jit_compile=True` on torch: that is dynamo over Keras'
        Python, which breaks its graph and recompiles on every call; the
        step compiles its forward pass itself (`_inference_forward`)."""
        if backend_support.backend_name() != "torch" or not self.jit_compile:
            return make(force)
        self._jit_compile = False
        try:
            return make(force)
        finally:
            self._jit_compile = True

    def make_predict_function(self, force=False):
        return self._made_without_keras_compile(super().make_predict_function, force)

    def make_test_function(self, force=False):
        return self._made_without_keras_compile(super().make_test_function, force)

    def predict_step(self, data):
        if backend_support.backend_name() != "torch":
            return super().predict_step(data)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self._inference_forward()(x)

    def test_step(self, data):
        """Keras' torch `test_step` with the recorded forward pass: the loss
        and metrics of `evaluate` / `test_on_batch` are computed eagerly on
        its outputs."""
        if backend_support.backend_name() != "torch":
            return super().test_step(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self._inference_forward()(x)
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
        batch_size = next(value for value in keras.tree.flatten(x) if value is not None).shape[0]
        self._loss_tracker.update_state(loss, sample_weight=batch_size)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
