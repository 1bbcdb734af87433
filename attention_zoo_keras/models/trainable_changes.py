"""Step functions that notice a layer's `trainable` changing after they were made.

Keras makes a model's training, evaluation and prediction functions for the
variables that are trainable when it makes them, and asks for `compile()`
again after a layer's `trainable` changes ("freeze the backbone, train the
head"). A user who forgets got, before this mixin, something different on
each backend, and never what was meant: on JAX `predict_on_batch` failed
on variable lists of the wrong length (`JaxTrainerState` keeps the lists
between steps) and training went on updating the frozen variables, as a
compiled TensorFlow step and a recorded torch step (`TracedSteps`) did.

`FollowsTrainableChanges` notes, when each step function is made, the
`trainable` flag of every variable (a variable is trainable in a model
exactly when the model and the variable are). When one has flipped since:

- an evaluation or prediction function is made anew: it reads the same
  values, only split differently into trainable and non-trainable;
- training raises a `ValueError` asking for `compile()`: Keras' training
  step and optimizer are built for the variables that were trainable when
  the model was compiled, and which variables to train, with which
  optimizer state, is the user's choice that `compile()` records.

The check reads one flag per variable each time Keras asks for a step
function (every `*_on_batch` call, once per `fit` / `evaluate` /
`predict`).
"""

class FollowsTrainableChanges:
    """Mixin for `keras.Model`s: step functions made anew, or training
    stopped with a clear error, when a `trainable` flag changed after they
    were made (see the module docstring).

    Example:

    >>> classifier.fit(texts, labels)  # doctest: +SKIP
    >>> classifier.backbone.trainable = False  # doctest: +SKIP
    >>> classifier.predict(texts)  # fine: inference needs no compile()  # doctest: +SKIP
    >>> classifier.fit(texts, labels)  # doctest: +SKIP
    ValueError: ... Call compile() again ...
    >>> classifier.compile()  # doctest: +SKIP
    >>> classifier.fit(texts, labels)  # trains the head only  # doctest: +SKIP
    """

    def make_train_function(self, force=False):
        return self._make_step_function("train", super().make_train_function, force)

    def make_test_function(self, force=False):
        return self._make_step_function("test", super().make_test_function, force)

    def make_predict_function(self, force=False):
        return self._make_step_function("predict", super().make_predict_function, force)

    def _make_step_function(self, step, make, force):
        """Keras' `make_<step>_function`, made anew (`force`) when a
        `trainable` flag changed since the function was made; for training,
        a `ValueError` instead."""
        changed = getattr(self, f"{step}_function", None) is not None and self._trainable_changed_since(step)
        if changed and step == "train":
            then, now = changed
            raise ValueError(
                f"{type(self).__name__}'s trainable variables changed after its training step was made "
                f"({then} were trainable then, {now} are now: was a layer's `trainable` set?). Call compile() "
                "again before training: Keras builds the training step and the optimizer for the variables "
                "trainable at compile() time, and would go on training the old set."
            )
        force = bool(force or changed)
        made = force or getattr(self, f"{step}_function", None) is None
        function = make(force=force)
        if made:
            flags = [(variable, variable.trainable) for variable in self.variables]
            self.__dict__.setdefault("_trainable_flags_when_made", {})[step] = (self.trainable, flags)
        return function

    def _trainable_changed_since(self, step):
        """`(trainable then, trainable now)`, the model's trainable variable
        counts, if a flag changed since `step`'s function was made, else
        `None`."""
        noted = self.__dict__.get("_trainable_flags_when_made", {}).get(step)
        if noted is None:
            return None
        model_trainable, flags = noted
        if model_trainable == self.trainable and all(variable.trainable == flag for variable, flag in flags):
            return None
        then = sum(flag for _, flag in flags) if model_trainable else 0
        return then, len(self.trainable_variables)
