"""Model steps recorded once per input signature and replayed (torch).

Keras runs a torch model eagerly: every layer call goes through Keras'
Python machinery (name scopes, dtype policies, masking, input checks), which
for a small model, a small batch or a one-token decoding step costs more
than the matrix products (a 4-layer, 128-wide BERT forward at batch 1 on 2
CPU cores: 11 ms eager, 1.0 ms replayed; GPT-2 small's decoding step: 70 ms
against 24 ms). JAX and TensorFlow compile Keras' steps whole, so there the
functions here return the step as it is. Under torch a step is recorded the
first time each input signature (the arguments' nesting and each tensor's
shape and dtype) is met, and replayed after:

* the variables' values are inputs of the recording (mapped onto the
  variables with a `keras.StatelessScope`), so a recording never holds
  stale weights and later training is seen;
* variables the step assigns (a stream memory, a metric's totals) are
  outputs of the recording, assigned after each replay;
* a step that draws from a Keras `SeedGenerator` (assigns its
  `seed_generator_state`) would replay one frozen draw, so its signature
  runs eagerly; torch's own unseeded draws (Keras' unseeded dropout) are
  recorded as random operations and draw anew at each replay, from the
  global generator as an eager call would (recording leaves the generator
  as it found it).

Shapes and Python branches are baked into a recording, so a step must not
branch on tensor values (`environment.is_concrete` is false while
recording, so input checks that read values are left to run before the
step); a decoding position is passed as a tensor so that one recording
serves every step. The caller keeps signatures few (bucketed padding). A
caller that cannot promise this passes a `fallback`: the step is first run
by `make_fx` on fake tensors, which fails on any read of a value, and a
step that reads one runs the fallback for that signature. On CUDA a
recording may also be replayed as one captured CUDA graph (`cuda_graphs`),
as the decoding loop's body is.

Two recorders, one per kind of step:

* `compile_step` (forward passes, decoding steps): `torch.jit.trace`,
  whose TorchScript interpreter replays an operation more cheaply than
  Python does (the BERT forward above: 1.0 ms against 1.6 ms for the same
  program as an FX graph). (`torch.jit.trace` is deprecated in favour of
  `torch.export`, which cannot yet record through Keras layers' Python; the
  torch version is pinned.)
* `compile_training_step`: `make_fx` (`torch.fx.experimental.proxy_tensor`),
  which records the backward pass too: `torch.autograd.grad` inside the
  recording becomes the backward's aten operations, so forward, backward,
  loss and metrics replay as one program and only the optimizer update
  runs outside it (any Keras optimizer; the library's `FusedAdam` is one
  fused kernel). It records with fake tensors (shapes and dtypes, no
  values): nothing is computed while recording (a third of the time of
  recording with real tensors), and a step that reads a tensor's value
  into Python (a seeded random draw, a value check) cannot be recorded
  with a wrong, frozen value: it fails, and its signature runs eagerly,
  with the reason logged.
"""

import logging
import warnings

import keras
import optree
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.common.variables import get_autocast_scope

from attention_zoo_keras.backend_support.cuda_graphs import captured_or_plain
from attention_zoo_keras.backend_support.environment import backend_name

logger = logging.getLogger("attention_zoo_keras")


def compile_step(
    step, variables, on_new_signature=None, compile_program=False, fallback=None, capture_cuda_graph=False
):
    """`step`, a model call repeated with few input shapes, made cheap per call.

    Under JAX and TensorFlow it is returned as is: the loop around it is
    compiled whole (`compile_inference`, Keras' compiled `predict`). Under
    torch it is recorded per input signature with `torch.jit.trace` and
    replayed (see the module's docstring).

    Args:
        step: callable. A function of (nested structures of) tensors
            returning (nested structures of) tensors.
        variables: list of keras.Variable. Every Keras variable `step`
            reads.
        on_new_signature: callable or None. Called with a signature (the
            arguments' nesting and a `(shape, dtype)` per input tensor)
            before it is recorded, under torch.
        compile_program: bool. Under torch, record with `make_fx` and
            compile each recording with `torch.compile` (inductor, static
            shapes): what `compile(jit_compile=True)` asks for. The first
            call of a signature then takes seconds to minutes.
        fallback: callable or None. Under torch, a function with `step`'s
            arguments and results. If given, a recording of `step` that
            reads a tensor's value into Python (a branch on a value, which
            the recording would freeze) is refused, and `fallback` runs for
            that signature instead (logged at INFO). Without it, `step` is
            assumed to branch on shapes only.
        capture_cuda_graph: bool. Under torch, on CUDA, replay each
            recording as a captured CUDA graph (`cuda_graphs.GraphReplay`):
            one launch per call instead of one per operation. `step` must
            write in place only rows it computes from its inputs (a cache
            row).

    Returns:
        A function with `step`'s arguments and results; under torch it has
        the attribute `signatures`: the recorded signatures (a live view).
    """
    if backend_name() != "torch":
        return step

    def record(nesting, flat_args):
        capture = capture_cuda_graph and any(t.is_cuda for t in flat_args)
        try:
            if compile_program:
                whole = lambda *step_args: (None, step(*step_args))
                program = _make_fx(whole, nesting, variables, 0, flat_args, True, capture)
                return None if program is None else lambda flat_args: program(flat_args)[0]
            return _jit_trace(step, nesting, variables, flat_args, strict=fallback is not None, capture=capture)
        except Exception as refusal:  # with a fallback: `make_fx` (strict) refuses a step that reads values
            if fallback is None:
                raise
            reason = (str(refusal).splitlines() or [type(refusal).__name__])[0]
            logger.info("The step branches on a tensor's value, so it is not recorded whole: %s", reason)
            return None

    return _Recordings(record, step if fallback is None else fallback, on_new_signature)


def compile_training_step(
    step, trainable_variables, variables, apply_gradients, on_new_signature=None, compile_program=False
):
    """One training step, `step`'s forward and backward pass recorded per
    input signature (torch), then `apply_gradients`.

    `step(*args)` returns `(loss, outputs)`. The returned function computes
    the gradients of `loss` with respect to `trainable_variables` (`None`
    for a variable the loss does not use, as Keras' eager torch step gives
    them), calls `apply_gradients(gradients)` with gradient tracking off
    (an optimizer's in-place update of the weights) and returns `outputs`.
    Under torch the forward and backward pass are recorded with `make_fx`
    and replayed (see the module's docstring); a signature whose recording
    fails runs eagerly, logged at INFO on the `attention_zoo_keras` logger.
    Only torch needs this: JAX and TensorFlow compile Keras' own train step
    whole.

    Args:
        step: callable. A function of (nested structures of) tensors
            returning a scalar loss and (nested structures of) tensors.
        trainable_variables: list of keras.Variable. The Keras variables to
            differentiate by.
        variables: list of keras.Variable. Every other Keras variable
            `step` reads or assigns (non-trainable weights, the optimizer's
            loss scale, metrics).
        apply_gradients: callable. Called with the list of gradients.
        on_new_signature: callable or None. As in `compile_step`.
        compile_program: bool. As in `compile_step`.

    Returns:
        A function with `step`'s arguments returning `step`'s outputs; it
        has the attribute `signatures`: the signatures recorded or tried
        (a live view).
    """
    import torch

    trainable_variables = list(trainable_variables)
    every_variable = trainable_variables + list(variables)

    def update(gradients):
        if trainable_variables:
            with torch.no_grad():
                apply_gradients(list(gradients))

    def eager(*args):
        loss, outputs = step(*args)
        if trainable_variables:
            weights = [variable.value for variable in trainable_variables]
            update(torch.autograd.grad(loss, weights, allow_unused=True))
        return outputs

    def record(nesting, flat_args):
        try:
            program = _make_fx(step, nesting, every_variable, len(trainable_variables), flat_args, compile_program)
        except Exception as error:  # make_fx refuses the step: it runs eagerly, as it would without recording
            reason = (str(error).splitlines() or [type(error).__name__])[0]
            logger.info("The training step cannot be recorded for these inputs, so it runs eagerly: %s", reason)
            return None
        if program is None:
            return None

        def replay(flat_args):
            outputs, gradients = program(flat_args)
            update(gradients)
            return outputs

        return replay

    return _Recordings(record, eager, on_new_signature)


class _Recordings:
    """A step's recordings by input signature: each is made on the first
    call with its signature by `record(nesting, flat_args)` (`nesting`: the
    arguments' `optree` structure), which returns a
    replay (a function of the flat input tensors) or `None` where the
    signature runs `eager(*args)` instead."""

    def __init__(self, record, eager, on_new_signature):
        self.record = record
        self.eager = eager
        self.on_new_signature = on_new_signature
        self.replays = {}
        self.signatures = self.replays.keys()

    def __call__(self, *args):
        import torch

        # `optree` (C++) flattens in microseconds, where `keras.tree` on
        # torch takes about a hundred per decoding step.
        leaves, nesting = optree.tree_flatten(args)
        flat_args = [t if isinstance(t, torch.Tensor) else keras.ops.convert_to_tensor(t) for t in leaves]
        # The nesting (e.g. a dict's names) and each tensor's shape and dtype.
        signature = (nesting, tuple((tuple(t.shape), t.dtype) for t in flat_args))
        if signature not in self.replays:
            if self.on_new_signature is not None:
                self.on_new_signature(signature)
            # `torch.jit.trace` runs the step once; its draws from torch's
            # global generator are undone, so the first replay draws what
            # an eager call would have.
            with torch.random.fork_rng():
                self.replays[signature] = self.record(nesting, _distinct(flat_args))
        replay = self.replays[signature]
        if replay is None:
            return self.eager(*args)
        return replay(flat_args)


def _distinct(tensors):
    """`tensors` with every repeat of a tensor object replaced by a copy.

    A recorder maps each input tensor object to one input of the program:
    given the same object twice (a beam search starts its finished beams
    as its running ones, its position at the prompt's length), every use
    of both is recorded as a use of one of them, and replays, whose inputs
    then differ, compute with the wrong one.
    """
    seen = set()
    distinct = []
    for tensor in tensors:
        distinct.append(tensor.clone() if id(tensor) in seen else tensor)
        seen.add(id(tensor))
    return distinct


def _stateless(step, nesting, variables):
    """`step` as a function of `(*values of variables, *flat args)` under a
    `StatelessScope` (`nesting`: the args' `optree` structure), returning
    `(step's result, indices of the variables it assigned, their new
    values)`."""

    def flat_step(*inputs):
        values, flat = inputs[: len(variables)], inputs[len(variables) :]
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            initial = [scope.get_current_value(variable) for variable in variables]
            result = step(*nesting.unflatten(list(flat)))
        final = [scope.get_current_value(variable) for variable in variables]
        assigned = [index for index, value in enumerate(final) if value is not initial[index]]
        return result, assigned, [final[index] for index in assigned]

    return flat_step


def _values(variables):
    """The variables' current tensors, detached, as a replay takes them.

    Outside a `StatelessScope` and an autocast scope a torch Keras
    variable's value is its `_value`; Keras' `value` property, which looks
    both up, costs about 5 µs a variable: 1 ms per decoding step of a
    12-layer model, more than a replayed CUDA graph takes to run.
    """
    if in_stateless_scope() or get_autocast_scope() is not None:
        return [variable.value.detach() for variable in variables]
    return [variable._value.detach() for variable in variables]


def _draws_random_numbers(variables, assigned):
    """Whether the recorded step assigned a Keras `SeedGenerator`'s state
    (said at INFO: the signature runs eagerly)."""
    draws = any(variables[index].name == "seed_generator_state" for index in assigned)
    if draws:
        logger.info("The step draws from a seeded Keras generator, so it runs eagerly for these inputs.")
    return draws


def _assign(variables, assigned, values):
    for index, value in zip(assigned, values):
        variables[index].assign(value)


def _jit_trace(step, nesting, variables, flat_args, strict=False, capture=False):
    """`step` on the arguments `nesting.unflatten(flat_args)` recorded by
    `torch.jit.trace`; returns the replay (from a CUDA graph if `capture`),
    or `None` if `step` draws random numbers.

    With `strict`, `step` is first run by `make_fx` on fake tensors (shapes
    and dtypes, nothing computed), which raises if `step` reads a tensor's
    value into Python: `torch.jit.trace` only warns then, and warns alike
    for shapes, which it traces as tensors.
    """
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    flat_step = _stateless(step, nesting, variables)
    recorded = {}

    def traced_function(*inputs):
        outputs, assigned, new_values = flat_step(*inputs)
        flat_outputs, structure = optree.tree_flatten(outputs)
        recorded.update(structure=structure, assigned=assigned)
        return (*flat_outputs, *new_values)

    weights = [variable.value.detach() for variable in variables]
    if strict:
        make_fx(traced_function, tracing_mode="fake")(*weights, *flat_args)
    with warnings.catch_warnings():
        # Shapes and Python constants are baked into the trace by design
        # (one trace per signature); the API is deprecated.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(traced_function, (*weights, *flat_args), check_trace=False)
    structure, assigned = recorded["structure"], recorded["assigned"]
    if _draws_random_numbers(variables, assigned):
        return None
    program = lambda inputs: traced(*inputs)
    if capture:
        program = captured_or_plain(program, len(variables), [*weights, *flat_args])

    def replay(flat_args):
        flat_outputs = program([*_values(variables), *flat_args])
        num_outputs = len(flat_outputs) - len(assigned)
        _assign(variables, assigned, flat_outputs[num_outputs:])
        return structure.unflatten(list(flat_outputs[:num_outputs]))

    return replay


def _make_fx(step, nesting, variables, num_trainable, flat_args, compile_program, capture=False):
    """`step`'s forward pass (on the arguments `nesting.unflatten(flat_args)`) and the gradients of its loss with
    respect to the first `num_trainable` variables, recorded by `make_fx`
    (and compiled by `torch.compile` if `compile_program`; replayed from a
    CUDA graph if `capture`).

    Returns `program`: `program(flat_args)` assigns the variables the step
    assigned and returns `(outputs, gradients)`, a gradient per trainable
    variable (`None` for one the loss does not use); or `None` if `step`
    draws random numbers."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    flat_step = _stateless(step, nesting, variables)
    recorded = {}

    def differentiated(*inputs):
        (loss, outputs), assigned, new_values = flat_step(*inputs)
        gradients = torch.autograd.grad(loss, inputs[:num_trainable], allow_unused=True) if num_trainable else ()
        used = [index for index, gradient in enumerate(gradients) if gradient is not None]
        flat_outputs, structure = optree.tree_flatten(outputs)
        recorded.update(structure=structure, assigned=assigned, used=used)
        return (*flat_outputs, *new_values, *(gradients[index] for index in used))

    inputs = [
        variable.value.detach().requires_grad_(index < num_trainable) for index, variable in enumerate(variables)
    ]
    graph = make_fx(differentiated, tracing_mode="fake")(*inputs, *flat_args)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    structure, assigned, used = recorded["structure"], recorded["assigned"], recorded["used"]
    if _draws_random_numbers(variables, assigned):
        return None
    if compile_program:
        graph = torch.compile(graph, fullgraph=True, dynamic=False)
    run = lambda inputs: graph(*inputs)
    if capture:
        with torch.no_grad():
            run = captured_or_plain(run, len(variables), [*_values(variables), *flat_args])
    num_outputs = structure.num_leaves

    def program(flat_args):
        with torch.no_grad():
            flat_results = run([*_values(variables), *flat_args])
        new_values = flat_results[num_outputs : num_outputs + len(assigned)]
        _assign(variables, assigned, new_values)
        outputs = structure.unflatten(list(flat_results[:num_outputs]))
        gradients = [None] * num_trainable
        for index, gradient in zip(used, flat_results[num_outputs + len(assigned) :]):
            gradients[index] = gradient
        return outputs, gradients

    return program
