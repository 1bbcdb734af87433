"""`fit`, `evaluate` and `predict` (and their `*_on_batch`) on torch as one
recorded program per input signature and step.

Keras runs a torch model eagerly: every layer call goes through Keras'
Python machinery (name scopes, dtype policies, masking, input checks), which
for a small model or a small batch costs more than its matrix products (a
4-layer, 128-wide BERT at batch 1: about 9 ms of dispatch against 2 ms for
`transformers`). JAX and TensorFlow compile Keras' steps whole; on torch
this mixin records each step once per input signature with
`backend_support` (`compile_step` for Keras' own `predict_step` and
`test_step`, `compile_training_step` for the forward and backward pass of
the train step, whose optimizer update then runs on the gradients) and
replays it, so a loop over many batches pays Keras' dispatch once per shape
bucket instead of once per batch; on CUDA the forward and evaluation steps
are replayed as one captured CUDA graph each (one launch per batch, where
BERT-base at batch 32 × 128 otherwise spends as long launching its kernels
as running them). The weights are inputs of every
recording, so training is seen; variables a step assigns (Transformer-XL's
stream memory, the metrics' totals) are assigned after each replay.
Bucketed padding (`TextPreprocessor`) keeps the shapes few. A step that
draws from a seeded Keras generator (the Reformer's LSH rotations without
a `hash_seed`) runs eagerly; Keras' unseeded dropout draws anew at every
replay.

`compile(run_eagerly=True)` turns the recording off (Keras' meaning:
every step runs eagerly, for debugging). Eager calls (`model(x)`) are
unchanged, and so is every step on JAX and TensorFlow.
"""

import logging
import warnings
import weakref

import keras

from attention_zoo_keras import backend_support

logger = logging.getLogger("attention_zoo_keras")

_STEP_NAMES = {"predict": "the forward pass", "test": "the evaluation step", "train": "the training step"}


class TracedSteps:
    """Mixin for `keras.Model`s: on torch, `predict_step`, `test_step` and
    `train_step` replay a recording of the step per input signature.

    `traced_signatures` maps each step (`"predict"`, `"test"`, `"train"`)
    to the input signatures recorded so far (one program each); a new one
    is logged at INFO on the `attention_zoo_keras` logger. When Keras makes
    a step's function anew (after `compile()`, for instance) its recordings
    start afresh.

    Example:

    >>> import logging
    >>> logging.getLogger("attention_zoo_keras").setLevel(logging.INFO)  # doctest: +SKIP
    >>> classifier.predict(texts)  # one recording per bucket width  # doctest: +SKIP
    >>> len(classifier.traced_signatures.get("predict", []))  # e.g. 2 on torch, 0 elsewhere  # doctest: +SKIP
    """

    @property
    def traced_signatures(self):
        """`{step: [input signature, ...]}` of the steps recorded so far (torch only)."""
        recordings = self.__dict__.get("_traced_steps", {})
        return {step: list(recorded.signatures) for step, recorded in recordings.items()}

    def _traced(self, step_name, make):
        """The recorded step `step_name`, made by `make(announce)` on first
        use (kept out of Keras' attribute tracking)."""
        recordings = self.__dict__.setdefault("_traced_steps", {})
        if step_name not in recordings:
            recordings[step_name] = make(self._announcer(_STEP_NAMES[step_name]))
        return recordings[step_name]

    def _announcer(self, what):
        """A function of an input signature that logs, at INFO on the
        `attention_zoo_keras` logger, that `what` is being recorded for it."""
        name = type(self).__name__

        def announce(signature):
            shapes = ", ".join(f"{str(dtype).removeprefix('torch.')}{list(shape)}" for shape, dtype in signature[1])
            logger.info("%s: recording %s for inputs %s (once per input shape).", name, what, shapes)

        return announce

    def _forget_recordings(self, step_name):
        """Keras makes a step's function anew after `compile()` or when the
        model's state changes shape (Transformer-XL's `reset_memory` for
        another number of streams): record anew too."""
        self.__dict__.setdefault("_traced_steps", {}).pop(step_name, None)

    def _reads_variables_of(self, model):
        """Notes that this model's compiled functions read `model`'s
        variables (a task's, its backbone's): when `model`'s variables
        change, this model's functions are forgotten too."""
        model.__dict__.setdefault("_models_reading_it", weakref.WeakSet()).add(self)

    def _forget_compiled_functions(self):
        """After the variables changed (quantized, LoRA added): Keras' step
        functions and every recording start afresh, for this model and for
        every model that reads its variables."""
        self.__dict__.pop("_traced_steps", None)
        self.train_function = self.test_function = self.predict_function = None
        for model in list(self.__dict__.get("_models_reading_it", ())):
            model._forget_compiled_functions()

    def _should_torch_compile(self):
        """Keras' torch trainer would `torch.compile` the Python step (whose
        recording then retraces per call); the recordings are compiled
        instead (`compile_program`), once per input signature."""
        return False

    def _records_steps(self):
        return backend_support.backend_name() == "torch" and not self.run_eagerly

    def make_predict_function(self, force=False):
        if force or self.predict_function is None:
            self._forget_recordings("predict")
        return super().make_predict_function(force)

    def make_test_function(self, force=False):
        if force or self.test_function is None:
            self._forget_recordings("test")
        return super().make_test_function(force)

    def make_train_function(self, force=False):
        if force or self.train_function is None:
            self._forget_recordings("train")
        return super().make_train_function(force)

    def predict_step(self, *args):
        """Keras' `predict_step`; on torch, recorded and replayed."""
        if not self._records_steps():
            return super().predict_step(*args)
        return self._recorded_keras_step("predict", super().predict_step, lambda: self.variables)(*args)

    def test_step(self, *args):
        """Keras' `test_step` (forward pass, loss, metrics); on torch,
        recorded and replayed."""
        if not self._records_steps():
            return super().test_step(*args)
        state = lambda: [*self.variables, *self.metrics_variables]  # the metrics' totals are assigned too
        return self._recorded_keras_step("test", super().test_step, state)(*args)

    def _recorded_keras_step(self, step_name, keras_step, state):
        """`keras_step` recorded per input signature, reading and assigning
        the variables `state()` lists (asked for once)."""

        def make(announce):
            return backend_support.compile_step(
                keras_step, state(), announce, compile_program=self.jit_compile, capture_cuda_graph=True
            )

        return self._traced(step_name, make)

    def train_step(self, *args):
        """Keras' `train_step`; on torch, its forward and backward pass
        (with the loss and metrics) recorded and replayed, then the
        optimizer's update applied to the gradients."""
        if not self._records_steps():
            return super().train_step(*args)
        (data,) = args
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)

        def make(announce):
            trainable = self.trainable_weights[:]
            if not trainable:
                warnings.warn("The model does not have any trainable weights.")
            optimizer_variables = [] if self.optimizer is None else self.optimizer.variables
            state = [*self.non_trainable_variables, *optimizer_variables, *self.metrics_variables]
            return backend_support.compile_training_step(
                self._loss_and_logs, trainable, state,
                apply_gradients=lambda gradients: self.optimizer.apply(gradients, trainable),
                on_new_signature=announce, compile_program=self.jit_compile,
            )

        batch = {"x": x, "y": y, "sample_weight": sample_weight}
        return self._traced("train", make)({name: value for name, value in batch.items() if value is not None})

    def _loss_and_logs(self, batch):
        """The differentiable part of Keras' torch `train_step`: the
        (optimizer-scaled) loss of `batch` and the logs after updating the
        loss tracker and metrics."""
        x, y, sample_weight = batch["x"], batch.get("y"), batch.get("sample_weight")
        y_pred = self(x, training=True) if self._call_has_training_arg else self(x)
        loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        batch_size = next(value for value in keras.tree.flatten(x) if value is not None).shape[0]
        self._loss_tracker.update_state(loss, sample_weight=batch_size)
        if self.optimizer is not None:
            loss = self.optimizer.scale_loss(loss)
        return loss, self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
