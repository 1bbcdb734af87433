"""Keras' JAX trainer state handed in and out of the compiled steps without
walking the model at every call.

Keras' JAX trainer runs a step as a pure function of the model's state: a
`train_on_batch` gathers every variable's value into lists (walking the
layer tree once per kind of variable: trainable, non-trainable, the
optimizer's, the metrics'), calls the compiled step, keeps the new values
as `model._jax_state` and assigns them back one `variable.assign` at a
time. For BERT-base (about 600 variables with Adam's) that is about 24 ms
of host time per step on an H200's host, longer than the step itself on the
GPU. On a 2-core CPU, with a 12-layer model too small to compute anything,
keeping what is below cuts a step's CPU time by a third (27.5 → 18.3 ms;
`benchmarks/train_on_batch_overhead_benchmark.py`).

`JaxTrainerState` keeps what Keras recomputes:

- the four variable lists, listed once per set of step functions (Keras
  makes its step functions anew whenever the variables change: after
  `compile()`, which it asks for after `trainable` changes, or when this
  library adds or replaces variables: LoRA, quantization; the library's
  models also make their evaluation and prediction functions anew when a
  `trainable` flag changed without `compile()`, `models.trainable_changes`);
- the values read and assigned back directly (`_direct_assign`, which still
  places each on its layout under a distribution), without converting and
  checking shapes the compiled step already fixed;
- `_jax_state` stored as a plain attribute: as a Keras attribute it is
  wrapped for tracking, element by element, at every step.

Nothing changes on other backends, where Keras has none of these methods
and `_jax_state` is never set.
"""


class JaxTrainerState:
    """Mixin for `keras.Model`s: Keras' JAX `_get_jax_state` and
    `jax_state_sync` over variable lists kept between steps.

    Example:

    >>> import keras
    >>> model.compile(optimizer="adam", loss="mse")  # doctest: +SKIP
    >>> for x, y in batches:  # doctest: +SKIP
    ...     model.train_on_batch(x, y)  # the state's lists are made at the first call only
    """

    def __setattr__(self, name, value):
        if name == "_jax_state":  # arrays only: nothing for Keras to track
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def _state_variables(self):
        """`{kind: [variable, ...]}` in Keras' order for each kind of state,
        listed anew when Keras has made new step functions or a new
        optimizer."""
        optimizer = getattr(self, "optimizer", None)
        key = (self.train_function, self.test_function, self.predict_function, optimizer)
        cached = self.__dict__.get("_state_variables_cache")
        if cached is None or any(old is not new for old, new in zip(cached[0], key)):
            lists = {
                "trainable_variables": self.trainable_variables,
                "non_trainable_variables": self.non_trainable_variables,
                "optimizer_variables": optimizer.variables if optimizer is not None else [],
                "metrics_variables": self.metrics_variables,
            }
            cached = self.__dict__["_state_variables_cache"] = (key, lists)
        return cached[1]

    def _get_jax_state(
        self,
        trainable_variables=False,
        non_trainable_variables=False,
        optimizer_variables=False,
        metrics_variables=False,
        purge_model_variables=False,
    ):
        lists = self._state_variables()
        wanted = {
            "trainable_variables": trainable_variables,
            "non_trainable_variables": non_trainable_variables,
            "optimizer_variables": optimizer_variables,
            "metrics_variables": metrics_variables,
        }
        state = tuple([_value_of(variable) for variable in lists[kind]] for kind, asked in wanted.items() if asked)
        if purge_model_variables:
            self._purge_model_variables(
                trainable_variables=trainable_variables,
                non_trainable_variables=non_trainable_variables,
                optimizer_variables=optimizer_variables,
                metrics_variables=metrics_variables,
            )
        return state

    def jax_state_sync(self):
        if not getattr(self, "_jax_state", None) or self._jax_state_synced:
            return
        lists = self._state_variables()
        for kind, values in self._jax_state.items():
            for variable, value in zip(lists[kind], values or ()):
                variable._direct_assign(value)
        self._jax_state_synced = True


def _value_of(variable):
    """`variable.value` outside any layer call (no autocast scope to apply),
    read without looking for one."""
    value = variable._value
    return variable.value if value is None else value
