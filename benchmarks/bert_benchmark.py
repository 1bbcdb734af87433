"""Times a BERT-base-shaped encoder: ours against KerasHub's (and, on torch,
Hugging Face transformers'), in one process, on the same inputs.

The Keras backend is the one KERAS_BACKEND names; run the script once per
backend (``bash benchmarks/run.sh bert`` does all three). Weights are random:
nothing is downloaded. On torch, ``--device`` picks the device (``auto``:
CUDA when torch sees a GPU, else the CPU): Keras is pointed at it with
``KERAS_TORCH_DEVICE`` and the transformers models are moved there. JAX and
TensorFlow run on their default device (printed in the header).

Contenders (all BERT-base: vocab 30522, 12 layers, 12 heads, hidden 768,
intermediate 3072, 512 positions, 2 segments, dropout 0.1; or with --small
4 layers, 2 heads, hidden 128, intermediate 512):

* ``ours``: ``attention_zoo_keras.models.BertBackbone``.
* ``ours_eager`` (torch only): the same model called eagerly,
  ``model(inputs, training=False)``, as in a notebook, and trained with
  ``compile(run_eagerly=True)`` (Keras' eager torch step, no recording).
* ``ours_xla_attention`` (JAX only): ours with ``flash_attention=False``
  given to every ``keras.ops.dot_product_attention`` it traces, so that on
  a GPU XLA's own fusions compute attention instead of cuDNN's fused
  kernel: which kernel pays at which length.
* ``ours_jax_gelu`` (JAX only): ours with JAX's own exact GELU
  (``jax.nn.gelu``, by ``erfc``) instead of the library's rational ``erf``
  (``backend_support.exact_gelu``).
* ``ours_mask_only`` (JAX only): ours with cuDNN's attention given the
  padding mask alone, without each row's key length
  (``backend_support.fused_dot_product_attention``), so that it reads the
  padded keys too.
* ``ours_padding_in_place`` (JAX only): ours built with the padding where
  the inputs have it, the blocks given the padding mask (and cuDNN each
  row's key length beside it), as before 2026-11-28; ours moves each row's
  padding after its tokens and gives the attention key lengths alone
  (``layers.padding_last``), so cuDNN reads no mask.
* ``ours_one_hot_embedding_gradient`` (JAX only): a candidate, not yet in
  the library: ours with the gradient of every ``Embedding`` lookup
  computed as a matrix product, one-hot(ids)ᵀ · upstream gradient (in
  bfloat16 with float32 sums where that gradient is bfloat16-exact, as in
  mixed precision), instead of XLA's scatter-add, which jaxlib 0.10.2 and
  later compile to a compare-and-swap loop that stalls when many positions
  share a token (padding; jax-ml/jax#38806). On an H200 that scatter took
  10 of 21 ms of kernel time in BERT-base's train step.
* ``ours_sorted_embedding_gradient`` (JAX only): the other candidate: the
  positions sorted by id, each run of equal ids summed by a segmented scan
  (float32) and stored in its id's row, every row written once
  (``unique_indices``), as PyTorch's CUDA embedding backward sums them: no
  atomic adds and no ``(positions, vocabulary)`` one-hot matrix (250 MB
  for BERT-base at 32 × 128 in bfloat16, 4 GB for a 50k vocabulary at
  32 × 1024).
* ``keras_hub``: ``keras_hub.models.BertBackbone``.
* ``transformers`` (torch backend only): ``transformers.BertModel`` with
  ``attn_implementation="sdpa"``.
* ``transformers_compiled`` (torch only, inference): the same under
  ``torch.compile`` (transformers at its best).

Precision (``--dtype``): ``float32`` everywhere, or ``bfloat16``. For
inference every contender then computes in bfloat16: the Keras models are
built with ``dtype="bfloat16"``, the transformers model is
``.to(torch.bfloat16)``. For training it is mixed precision: the Keras models
with the dtype policy ``"mixed_bfloat16"`` (float32 weights, bfloat16
compute), transformers with float32 weights under
``torch.autocast(device_type, dtype=torch.bfloat16)``. Each mode builds its
own models (with its own dtype), once per contender.

What each contender receives: the same ids, already on the device before any
clock starts. The Keras models take a dict of int32 ``token_ids``,
``segment_ids`` and ``padding_mask`` (on torch, tensors on the device; on JAX
and TensorFlow, numpy arrays, as the compiled step takes them) and, to
train, float32 zero targets likewise; transformers takes int64
``input_ids``, ``token_type_ids`` and ``attention_mask`` tensors on the
device. A training step returns its loss to Python (Keras as numpy,
transformers with ``float``). Inference outputs (``--outputs``):

* ``numpy`` (the default): the outputs come back to the host alike:
  ``predict_on_batch`` returns numpy arrays, and the transformers
  contenders convert theirs with the same ``keras.ops.convert_to_numpy``.
  On a GPU this copy and conversion of the ``(batch, seq_len, hidden)``
  output (for bfloat16, through float32 on the host) can take longer than
  the forward pass itself.
* ``device`` (torch and JAX): the outputs stay on the device for everyone.
  The Keras models run the step that ``predict_on_batch`` runs,
  ``model.predict_function`` (made by ``make_predict_function()``: on
  torch, ours' recorded replay; on JAX, the ``jax.jit``-compiled step, fed
  and returning the weights' state as ``predict_on_batch`` does, and waited
  for with ``jax.block_until_ready``), without its conversion to numpy and
  without our input checks; transformers returns its output tensors. The
  outputs are checked after the timing.

Our ``predict_on_batch`` and ``train_on_batch`` check the ids on the host
(``validate_inputs``): on CUDA a copy of the ids back from the device, part
of our time.

Measured, per contender:

* inference: the Keras models go through the same call path,
  ``model.predict_on_batch(inputs)`` or its step (see ``--outputs``): a
  ``jax.jit``-compiled stateless call on JAX; a ``tf.function``,
  XLA-compiled when ``jit_compile`` resolves to True, on TensorFlow; on
  torch ours replays a recording of the step made once per input shape,
  compiled by inductor with ``--jit-compile true``, while KerasHub's runs
  eagerly. transformers runs ``model(**inputs)`` in eval mode under
  ``torch.no_grad()``.
* training: one optimizer step on the mean squared error of the pooled output
  against zeros, learning rate 1e-5, dropout active. Keras models:
  ``model.train_on_batch`` after ``compile`` (ours with the library's
  ``FusedAdam``, which its tasks compile with by default; KerasHub with
  ``keras.optimizers.Adam``); transformers: a manual forward / backward /
  optimizer step, with ``torch.optim.AdamW(fused=True, weight_decay=0.0)``
  on CUDA (torch's fused kernel, the optimizer transformers' ``Trainer``
  defaults to; without weight decay its update is Adam's) and
  ``torch.optim.Adam`` on the CPU. On torch ours replays its forward and
  backward pass recorded once per input shape, then applies the fused
  update. The optimizer of each contender is printed with the results.

For each mode all contenders are built first, then each is warmed up
(compiled; the first call is timed on its own and reported beside the
steady-state numbers), and the ``--repeats`` timed calls are interleaved
round-robin (rotating who goes first) so that other load on the machine
weighs on every contender alike. On CUDA the device is synchronized
(``torch.cuda.synchronize()``) before each clock starts and after each call,
so a time covers the device's work (the process CPU time then includes the
host's wait for the device); on JAX and TensorFlow the numpy outputs wait
for it. Reported: the median and the minimum of the wall times
(``time.perf_counter``), and the median process CPU time
(``time.process_time``). The ratio columns are other / ours, above 1 meaning
ours is faster: of the medians, of the minima, and "paired", the median over
rounds of each round's ratio, which is the one to trust on a busy machine.
Beside them, the achieved model FLOP/s, the step's model FLOPs
(``bert_forward_flops``; a training step counts 3x the forward) over the
median time, and the MFU, that over the device's peak FLOP/s for the
precision (``peak_flops``; ``timing.PEAK_RATES``, or ``--peak-tflops``).

Example::

    KERAS_BACKEND=jax python -m benchmarks.bert_benchmark --batch-size 8 --seq-len 128
    KERAS_BACKEND=torch python -m benchmarks.bert_benchmark --batch-size 32 --dtype bfloat16 \\
        --contenders ours,transformers,transformers_compiled   # on a GPU
"""

import argparse
import functools
import gc
import os
import sys
import time

# Shared helpers (stdlib-only at import time, so they run before numpy/Keras).
from benchmarks.contenders import record_failure
from benchmarks.contenders import ratio_cells
from benchmarks.contenders import select_contenders
from benchmarks.contenders import summarise
from benchmarks.contenders import time_interleaved
from benchmarks.contenders import timed_call
from benchmarks.contenders import transformers_optimizer
from benchmarks.contenders import with_setting
from benchmarks.timing import cpu_line
from benchmarks.timing import cpu_model
from benchmarks.timing import device_description
from benchmarks.timing import device_synchronizer
from benchmarks.timing import fmt_ms
from benchmarks.timing import fmt_percent
from benchmarks.timing import fmt_versions
from benchmarks.timing import load_average
from benchmarks.timing import load_line
from benchmarks.timing import peak_rates
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

BERT_BASE = dict(
    vocabulary_size=30522,
    num_layers=12,
    num_heads=12,
    hidden_dim=768,
    intermediate_dim=3072,
    max_sequence_length=512,
    num_segments=2,
)
# A small encoder (--small): 4 layers, 128 wide, where per-op dispatch,
# not arithmetic, sets the speed (the CPU target of issue 20).
SMALL = dict(BERT_BASE, num_layers=4, num_heads=2, hidden_dim=128, intermediate_dim=512)
# A few-second smoke test of the script itself (--tiny); not a benchmark.
TINY = dict(BERT_BASE, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128)
CONTENDERS = (
    "ours", "ours_eager", "ours_xla_attention", "ours_jax_gelu", "ours_mask_only",
    "ours_padding_in_place", "ours_one_hot_embedding_gradient", "ours_sorted_embedding_gradient", "keras_hub",
    "transformers", "transformers_compiled"
)
TORCH_ONLY = ("ours_eager", "transformers", "transformers_compiled")
JAX_ONLY = (
    "ours_xla_attention", "ours_jax_gelu", "ours_mask_only", "ours_padding_in_place",
    "ours_one_hot_embedding_gradient", "ours_sorted_embedding_gradient",
)
DEFAULT_CONTENDERS = tuple(name for name in CONTENDERS if name not in JAX_ONLY)
LEARNING_RATE = 1e-5


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls (compilation) first")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(),
        help="intra-op (and inter-op) threads, the same for every contender (default: all cores)",
    )
    parser.add_argument(
        "--backend-label", default=None,
        help="label printed for this run (default: the Keras backend's name)",
    )
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"],
        help="torch backend: where Keras and transformers run (auto: cuda when torch sees a GPU, else cpu); "
        "JAX and TensorFlow take only auto (their default device)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"],
        help="bfloat16: inference in bfloat16, training in mixed precision (see the module docstring)",
    )
    parser.add_argument(
        "--outputs", default="numpy", choices=["numpy", "device"],
        help="inference outputs: numpy on the host for every contender (predict_on_batch), or left on the "
        "device (torch and JAX: Keras' predict_function, the step of predict_on_batch)",
    )
    parser.add_argument(
        "--jit-compile", default="auto", choices=["auto", "true", "false"],
        help="`jit_compile` given to compile() of both Keras models",
    )
    parser.add_argument(
        "--contenders", default=",".join(DEFAULT_CONTENDERS),
        help="comma-separated subset of " + ",".join(CONTENDERS) + " "
        "(ours_eager: `model(inputs, training=False)` and an eager `train_on_batch` (`run_eagerly=True`); "
        "transformers_compiled: `torch.compile` of the transformers model, inference only; both torch only; "
        "ours_xla_attention, ours_jax_gelu, ours_mask_only, ours_padding_in_place, "
        "ours_one_hot_embedding_gradient and ours_sorted_embedding_gradient, JAX only, not run unless named: see the module docstring)",
    )
    parser.add_argument("--modes", default="inference,training", help="comma-separated subset")
    parser.add_argument(
        "--no-padding", action="store_true",
        help="every row full length (default: rows of random length in [seq_len/2, seq_len])",
    )
    parser.add_argument("--small", action="store_true", help="a 4-layer, 128-wide encoder instead of BERT-base")
    parser.add_argument("--tiny", action="store_true", help="2-layer, 64-wide smoke test of the script")
    parser.add_argument(
        "--peak-tflops", type=float, default=None,
        help="peak TFLOP/s the MFU column divides by, instead of the device's in timing.PEAK_RATES "
        "(without either, as on CPUs, MFU is '-')",
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    return parser.parse_args(argv)


def bert_forward_flops(config, batch_size, seq_len):
    """Model FLOPs of one forward pass of the encoder `config` describes over
    `batch_size` x `seq_len` tokens, padded positions included (every
    position is computed): per layer and token, 2 * (4 d^2 + 2 d d_ff) for the
    matmuls of the query, key, value and output projections and of the
    feed-forward block, plus 4 S d for the attention scores (Q K^T) and their
    weighted sum of the values (d = hidden_dim, d_ff = intermediate_dim, S =
    seq_len). Left out: the embeddings (lookups), the pooler (one d x d
    matmul per row, under 0.1% at S = 128), biases, layer norms, softmax and
    activations."""
    d, d_ff = config["hidden_dim"], config["intermediate_dim"]
    per_token = 2 * (4 * d * d + 2 * d * d_ff) + 4 * seq_len * d
    return config["num_layers"] * batch_size * seq_len * per_token


def peak_flops(args, backend, description):
    """`(FLOP/s, where it comes from)`: the peak the MFU column divides by.
    `--peak-tflops` where given; else the `PEAK_RATES` entry of the device
    (`description`) for the precision: its bf16 peak for `--dtype bfloat16`
    (bfloat16 inference and mixed-bfloat16 training compute in bfloat16); for
    float32 its TF32 peak where float32 matmuls may run in TF32 (JAX on a
    GPU by default; torch unless `torch.get_float32_matmul_precision()` is
    'highest'), else its plain float32 peak. `(None, ...)` where the table
    has no entry (CPUs)."""
    if args.peak_tflops is not None:
        return args.peak_tflops * 1e12, "--peak-tflops"
    rates = peak_rates(description)
    if rates is None:
        return None, "no peak known for this device; --peak-tflops sets one"
    if args.dtype == "bfloat16":
        kind = "bf16"
    elif backend == "torch":
        import torch

        kind = "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    else:  # JAX (TensorFlow's device has no entry)
        import jax

        kind = "fp32" if jax.config.jax_default_matmul_precision in ("highest", "float32") else "tf32"
    return rates[kind], f"the device's dense {kind} peak in timing.PEAK_RATES"


def make_inputs(batch_size, seq_len, vocabulary_size, no_padding, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    if no_padding:
        lengths = np.full((batch_size,), seq_len)
    else:
        lengths = rng.integers(seq_len // 2, seq_len + 1, size=(batch_size,))
        lengths[0] = seq_len  # the batch spans the whole length
    positions = np.arange(seq_len)[None, :]
    padding_mask = (positions < lengths[:, None]).astype("int32")
    token_ids = rng.integers(1, vocabulary_size, size=(batch_size, seq_len)).astype("int32")
    token_ids = token_ids * padding_mask
    # Two segments: the second half of each row's real tokens is segment 1.
    segment_ids = ((positions >= (lengths[:, None] // 2)) & (padding_mask > 0)).astype("int32")
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


# --------------------------------------------------------------------------- Keras


def keras_dtype(dtype, mode):
    """The dtype policy of the Keras models: `float32`, or for `--dtype
    bfloat16` all-bfloat16 inference and mixed-precision training."""
    if dtype == "float32":
        return "float32"
    return "bfloat16" if mode == "inference" else "mixed_bfloat16"


def keras_data(inputs, config, backend, device):
    """`(inputs, targets)` as the Keras models take them: numpy on JAX and
    TensorFlow, tensors already on `device` on torch (so that no step
    copies them to the device)."""
    import numpy as np

    targets = {"pooled_output": np.zeros((inputs["token_ids"].shape[0], config["hidden_dim"]), "float32")}
    if backend != "torch":
        return inputs, targets
    import torch

    def to_device(values):
        return {name: torch.from_numpy(value).to(device) for name, value in values.items()}

    return to_device(inputs), to_device(targets)


def keras_step(model, mode, inputs, targets, jit_compile, optimizer, outputs, run_eagerly=False):
    """The inference or training callable of a Keras backbone, through the
    public Trainer API so ours and KerasHub's take the same path, and its
    description. With `outputs="device"`, inference runs `predict_on_batch`'s
    own step, `predict_function`, and returns its tensors as they are."""
    import keras

    jit = {"auto": "auto", "true": True, "false": False}[jit_compile]
    model.compile(
        optimizer=optimizer,
        loss={"pooled_output": keras.losses.MeanSquaredError()},
        jit_compile=False if run_eagerly else jit,
        run_eagerly=run_eagerly,
    )
    flags = f"jit_compile={model.jit_compile}, run_eagerly={model.run_eagerly}, dtype policy {model.dtype_policy.name}"
    if mode == "training":
        path = f"train_on_batch with {type(optimizer).__name__} ({flags})"
        return (lambda: model.train_on_batch(inputs, targets)), path
    if outputs == "device":
        model.make_predict_function()
        path = f"predict_function (predict_on_batch's step), outputs on the device ({flags})"
        if keras.backend.backend() == "jax":
            return jax_predict_step(model, inputs), path
        return (lambda: model.predict_function([(inputs,)])), path
    return (lambda: model.predict_on_batch(inputs)), f"predict_on_batch ({flags})"


def jax_predict_step(model, inputs):
    """Keras' JAX `predict_function` as `predict_on_batch` calls it, the
    weights' state passed in and carried from call to call (the step
    donates it), its outputs left on the device once it has finished."""
    import jax

    state = [([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])]

    def infer():
        outputs, state[0] = model.predict_function(state[0], iter([(inputs,)]))
        return jax.block_until_ready(outputs)

    return infer


def ours_eager_step(model, inputs, outputs):
    """Ours called eagerly as in a notebook, `model(inputs, training=False)`
    under `torch.no_grad()`: Keras' per-layer dispatch on every call."""
    import keras
    import torch

    convert = keras.ops.convert_to_numpy if outputs == "numpy" else (lambda tensor: tensor)

    def infer():
        with torch.no_grad():
            out = model(inputs, training=False)
        return {name: convert(value) for name, value in out.items()}

    return infer


def check_outputs(out, batch_size, seq_len, config):
    import keras
    import numpy as np

    seq, pooled = (keras.ops.convert_to_numpy(out[name]) for name in ("sequence_output", "pooled_output"))
    assert seq.shape == (batch_size, seq_len, config["hidden_dim"]), seq.shape
    assert pooled.shape == (batch_size, config["hidden_dim"]), pooled.shape
    assert np.isfinite(seq.astype("float32")).all() and np.isfinite(pooled.astype("float32")).all()


def check_loss(logs):
    import numpy as np

    loss = logs["loss"] if isinstance(logs, dict) else logs
    assert np.isfinite(float(np.asarray(loss))), logs


# --------------------------------------------------------------------------- transformers


def transformers_bert(config):
    """`transformers.BertModel` of the shape `config` names (random weights,
    dropout 0.1, sdpa attention)."""
    import transformers

    hf_config = transformers.BertConfig(
        vocab_size=config["vocabulary_size"],
        hidden_size=config["hidden_dim"],
        num_hidden_layers=config["num_layers"],
        num_attention_heads=config["num_heads"],
        intermediate_size=config["intermediate_dim"],
        max_position_embeddings=config["max_sequence_length"],
        type_vocab_size=config["num_segments"],
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    hf_config._attn_implementation = "sdpa"
    model = transformers.BertModel(hf_config)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return model


def transformers_inputs(inputs, device):
    """`make_inputs`' arrays as `transformers`' int64 keyword arguments on `device`."""
    import torch

    names = {"input_ids": "token_ids", "token_type_ids": "segment_ids", "attention_mask": "padding_mask"}
    return {name: torch.from_numpy(inputs[ours]).long().to(device) for name, ours in names.items()}


def transformers_step(inputs, config, mode, dtype, device, outputs, compiled=False):
    """`(model, step, description, optimizer name)` of `transformers`'
    BertModel in `mode` on `device`: eval + `torch.no_grad()` inference
    (in bfloat16 weights for `--dtype bfloat16`; `torch.compile`d forward
    with `compiled`; outputs converted to numpy as `predict_on_batch` does,
    or left on the device), or a manual training step (float32 weights,
    under bfloat16 autocast for `--dtype bfloat16`)."""
    import keras
    import torch

    model = transformers_bert(config)
    torch_inputs = transformers_inputs(inputs, device)
    bfloat16 = dtype == "bfloat16"

    if mode == "inference":
        model.to(device=device, dtype=torch.bfloat16 if bfloat16 else torch.float32).eval()
        if compiled:
            model.forward = torch.compile(model.forward)
        convert = keras.ops.convert_to_numpy if outputs == "numpy" else (lambda tensor: tensor)

        def infer():
            with torch.no_grad():
                out = model(**torch_inputs)
            return {"sequence_output": convert(out.last_hidden_state), "pooled_output": convert(out.pooler_output)}

        weights = "bfloat16" if bfloat16 else "float32"
        path = f"eval + torch.no_grad() model(**inputs) (sdpa, {weights} weights, outputs {outputs})"
        if compiled:
            path = "torch.compile(model.forward), " + path
        return model, infer, path, None

    model.to(device).train()
    optimizer, optimizer_name = transformers_optimizer(model.parameters(), LEARNING_RATE, device)
    target = torch.zeros(inputs["token_ids"].shape[0], config["hidden_dim"], device=device)

    def train():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bfloat16):
            out = model(**torch_inputs)
            loss = torch.nn.functional.mse_loss(out.pooler_output, target)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    precision = "float32 weights under torch.autocast(bfloat16)" if bfloat16 else "float32"
    path = f"forward, backward, {optimizer_name} step (sdpa, {precision})"
    return model, train, path, optimizer_name


# --------------------------------------------------------------------------- main


def build_contender(name, mode, args, config, inputs, keras_inputs, device):
    """`(step, description, parameter count, optimizer name)` of contender
    `name` in `mode`."""
    if name in ("transformers", "transformers_compiled"):
        compiled = name == "transformers_compiled"
        model, step, path, optimizer_name = transformers_step(
            inputs, config, mode, args.dtype, device, args.outputs, compiled
        )
        return step, path, sum(p.numel() for p in model.parameters()), optimizer_name

    dtype = keras_dtype(args.dtype, mode)
    if name == "keras_hub":
        import keras
        import keras_hub

        model = keras_hub.models.BertBackbone(**config, dtype=dtype)
        optimizer, optimizer_name = keras.optimizers.Adam(LEARNING_RATE), "keras.optimizers.Adam"
    else:
        from attention_zoo_keras.backend_support import attention_kernels
        from attention_zoo_keras.models import BertBackbone
        from attention_zoo_keras.optimizers import FusedAdam

        build = functools.partial(BertBackbone, **config, dtype=dtype)
        if name == "ours_padding_in_place":
            build = with_setting(build, attention_kernels, "_PADDING_LAST_UNDER_JAX", False)
        model = build()
        optimizer = FusedAdam(LEARNING_RATE)
        optimizer_name = "FusedAdam (the library's default; one fused kernel on torch)"
    inputs, targets = keras_inputs
    if name == "ours_eager" and mode == "inference":
        step = ours_eager_step(model, inputs, args.outputs)
        path = (
            f"model(inputs, training=False) under torch.no_grad() (dtype policy {model.dtype_policy.name}, "
            f"outputs {args.outputs})"
        )
    else:
        eager = name == "ours_eager"
        jit_compile = "false" if eager else args.jit_compile
        step, path = keras_step(model, mode, inputs, targets, jit_compile, optimizer, args.outputs, run_eagerly=eager)
    if name == "ours_xla_attention":
        step, path = with_xla_attention(step), path + ", attention by XLA (flash_attention=False)"
    if name == "ours_jax_gelu":
        from attention_zoo_keras.backend_support import activation_kernels

        step = with_setting(step, activation_kernels, "_RATIONAL_ERF_UNDER_JAX", False)
        path += ", JAX's own exact GELU (jax.nn.gelu, by erfc)"
    if name == "ours_mask_only":
        from attention_zoo_keras.backend_support import attention_kernels

        step = with_setting(step, attention_kernels, "_KEY_LENGTHS_FOR_CUDNN", False)
        path += ", cuDNN's attention given the mask alone (no key lengths)"
    if name == "ours_padding_in_place":
        path += ", built with the padding in place (its mask to the blocks, cuDNN given key lengths beside it)"
    if name == "ours_one_hot_embedding_gradient":
        step = with_embedding_gradient(step, checked_table_gradient(one_hot_table_gradient))
        path += ", embedding gradients as one-hot matrix products (candidate)"
    if name == "ours_sorted_embedding_gradient":
        step = with_embedding_gradient(step, checked_table_gradient(sorted_table_gradient))
        path += ", embedding gradients summed by id after sorting, no atomic adds (candidate)"
    return step, path, model.count_params(), optimizer_name if mode == "training" else None


def with_embedding_gradient(step, table_gradient):
    """`step` with every `keras.layers.Embedding` lookup it traces
    differentiated by `table_gradient(ids, gradient, rows, bfloat16_gradient)`
    (flat ids `(N,)`, the upstream gradient `(N, width)`, the table's row
    count) instead of XLA's scatter-add: the candidates
    `ours_one_hot_embedding_gradient` (`one_hot_table_gradient`) and
    `ours_sorted_embedding_gradient` (`sorted_table_gradient`).
    `bfloat16_gradient`: the layer computes in bfloat16, so the gradient is
    the transpose of the cast to it and holds bfloat16 values."""
    import jax
    import jax.numpy as jnp
    import keras

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
    def lookup(table, ids, bfloat16_gradient):
        return jnp.take(table, ids, axis=0)

    def lookup_forward(table, ids, bfloat16_gradient):
        return lookup(table, ids, bfloat16_gradient), (ids, table)  # (the table lives on as a variable)

    def lookup_backward(bfloat16_gradient, residuals, gradient):
        ids, table = residuals
        gradient = gradient.reshape(-1, gradient.shape[-1])
        flat_gradient = table_gradient(ids.reshape(-1), gradient, table.shape[0], bfloat16_gradient)
        return flat_gradient.astype(table.dtype), None

    lookup.defvjp(lookup_forward, lookup_backward)

    def call(self, inputs):
        bfloat16_gradient = keras.backend.standardize_dtype(self.compute_dtype) == "bfloat16"
        table = keras.ops.convert_to_tensor(self.embeddings)  # a variable: its value (LoRA included)
        outputs = lookup(table, keras.ops.cast(inputs, "int32"), bfloat16_gradient)
        return keras.ops.cast(outputs, self.compute_dtype)

    return with_setting(step, keras.layers.Embedding, "call", call)


def checked_table_gradient(table_gradient):
    """`table_gradient`, first checked on this device against XLA's
    scatter-add in float32 (a vocabulary of 1000, 4096 positions, a third of
    them id 0 as padding would be): raises if a row differs by more than
    1e-4 of the largest row's norm."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, 4096).astype("int32")
    ids[::3] = 0
    gradient = rng.normal(size=(4096, 64)).astype("float32")
    expected = jnp.zeros((1000, 64), jnp.float32).at[ids].add(gradient)
    got = jax.jit(table_gradient, static_argnums=(2, 3))(jnp.asarray(ids), jnp.asarray(gradient), 1000, False)
    error = float(jnp.abs(got - expected).max() / jnp.abs(expected).max())
    print(f"[{table_gradient.__name__}] against the scatter-add: max relative difference {error:.1e}")
    if not error < 1e-4:
        raise AssertionError(f"{table_gradient.__name__} differs from the scatter-add by {error:.1e}")
    return table_gradient


def one_hot_table_gradient(ids, gradient, rows, bfloat16_gradient):
    """one-hot(ids)ᵀ · gradient, a matrix product: in bfloat16 with float32
    sums where the gradient is bfloat16-exact (exactly), else in float32 at
    full precision. Memory: an `(N, rows)` one-hot matrix."""
    import jax.numpy as jnp

    product_dtype = jnp.bfloat16 if bfloat16_gradient else gradient.dtype
    one_hot = (ids[:, None] == jnp.arange(rows)).astype(product_dtype)
    return jnp.matmul(
        one_hot.T, gradient.astype(product_dtype), precision="highest", preferred_element_type=jnp.float32
    )


def sorted_table_gradient(ids, gradient, rows, bfloat16_gradient):
    """The rows of `gradient` summed per id without atomic adds, as
    PyTorch's CUDA embedding backward does: sort the positions by id, sum
    each run of equal ids by a segmented scan (float32, a tree of sums),
    and store each run's total in its id's row; the stores go to distinct
    rows (`unique_indices`), so none waits on another.

        order = argsort(ids);  s = ids[order];  G = gradient[order]
        S_i = G_i + (S_{i-1} if s_i = s_{i-1} else 0)
        table_gradient[s_i] = S_i  where i is the last of its run
    """
    import jax
    import jax.numpy as jnp

    order = jnp.argsort(ids, stable=True)
    sorted_ids = ids[order]
    sorted_gradient = gradient[order].astype(jnp.float32)
    starts = jnp.concatenate([jnp.ones((1,), bool), sorted_ids[1:] != sorted_ids[:-1]])

    def combine(left, right):
        left_start, left_sum = left
        right_start, right_sum = right
        return left_start | right_start, jnp.where(right_start[..., None], right_sum, left_sum + right_sum)

    _, run_sums = jax.lax.associative_scan(combine, (starts, sorted_gradient))
    run_ends = jnp.concatenate([starts[1:], jnp.ones((1,), bool)])
    destination = jnp.where(run_ends, sorted_ids, rows)  # positions inside a run go out of bounds: dropped
    table_gradient = jnp.zeros((rows, gradient.shape[-1]), jnp.float32)
    return table_gradient.at[destination].set(run_sums, mode="drop", unique_indices=True)


def with_xla_attention(step):
    """`step` with every `keras.ops.dot_product_attention` it calls (and so
    traces) given `flash_attention=False`: on a JAX GPU, XLA's own fusions
    instead of cuDNN's fused kernel (which the key lengths would reach
    directly: they are turned off)."""
    import keras

    from attention_zoo_keras.backend_support import attention_kernels

    fused = functools.partial(keras.ops.dot_product_attention, flash_attention=False)
    step = with_setting(step, attention_kernels, "_KEY_LENGTHS_FOR_CUDNN", False)
    return with_setting(step, keras.ops, "dot_product_attention", fused)


def main(argv=None):
    args = parse_args(argv)
    backend, device = start_backend(args.threads, args.device)

    import keras

    if backend == "tensorflow" and args.outputs != "numpy":
        raise SystemExit(f"--outputs {args.outputs} is for the torch and JAX backends")
    label = args.backend_label or backend
    contenders = select_contenders(args.contenders, CONTENDERS)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if backend != "torch":
        contenders = [name for name in contenders if name not in TORCH_ONLY]
    if backend != "jax":
        contenders = [name for name in contenders if name not in JAX_ONLY]
    synchronize = device_synchronizer(backend, device)

    config = TINY if args.tiny else SMALL if args.small else BERT_BASE
    inputs = make_inputs(args.batch_size, args.seq_len, config["vocabulary_size"], args.no_padding)
    keras_inputs = keras_data(inputs, config, backend, device)
    size = "TINY smoke test" if args.tiny else "small (4 layers, 128 wide)" if args.small else "BERT-base"
    precision = "float32" if args.dtype == "float32" else "bfloat16 (inference), mixed bfloat16 (training)"
    description = device_description(backend, device)
    peak, peak_source = peak_flops(args, backend, description)
    # Model FLOPs of a step: a training step (forward and backward) counts 3x the forward.
    forward_flops = bert_forward_flops(config, args.batch_size, args.seq_len)
    step_flops = {mode: forward_flops * (3 if mode == "training" else 1) for mode in modes}
    print(f"# {size} benchmark, backend={label}, {precision}")
    print(f"device: {description}")
    print(f"peak for MFU: {f'{peak / 1e12:g} TFLOP/s' if peak else '-'} ({peak_source})")
    print(cpu_line(args.threads, per_library=True))
    print(fmt_versions(versions(backend)))
    print(
        f"shapes: batch {args.batch_size} x seq_len {args.seq_len} "
        f"({int(inputs['padding_mask'].sum())} of {inputs['padding_mask'].size} tokens unpadded); "
        f"warmup {args.warmup}, repeats {args.repeats} (median reported); inference outputs {args.outputs}"
    )
    print(load_line("start"))
    sys.stdout.flush()

    results = {name: {} for name in contenders}  # contender -> mode -> {...}, or {"error": ...} where it failed
    steps = {}  # contender -> its step in the mode being timed
    checks = {
        "inference": lambda out: check_outputs(out, args.batch_size, args.seq_len, config),
        "training": check_loss,
    }

    def fail(name, mode, error):
        results[name][mode] = {}  # what was recorded before goes: the error replaces it
        record_failure(results[name][mode], error, f"[{name}] {mode}")
        steps.pop(name, None)

    def timed(step):
        """`(output, wall seconds, process CPU seconds)` of one call, the device's work included."""
        return timed_call(step, synchronize)

    for mode in modes:
        print(f"\n## {mode}, dtype policy {keras_dtype(args.dtype, mode)}")
        # Build every contender first, then time them interleaved (round-robin,
        # rotating who goes first), so that anything else loading the machine
        # during the run weighs on all of them alike.
        keras.utils.set_random_seed(0)
        for name in contenders:
            if mode == "training" and name == "transformers_compiled":
                continue  # inference only
            try:
                start = time.perf_counter()
                step, path, params, optimizer_name = build_contender(
                    name, mode, args, config, inputs, keras_inputs, device
                )
                synchronize()
                build_s = time.perf_counter() - start
                results[name][mode] = {"build_s": build_s, "path": path, "params": int(params)}
                if optimizer_name:
                    results[name][mode]["optimizer"] = optimizer_name
                steps[name] = step
                print(f"[{name}] {params:,} parameters, built in {build_s:.1f}s; {path}")
                sys.stdout.flush()
            except Exception as error:  # report and go on with the other contenders
                fail(name, mode, error)
            gc.collect()

        for name in list(steps):
            try:
                out, first, _ = timed(steps[name])
                checks[mode](out)
                for _ in range(args.warmup - 1):
                    steps[name]()
                synchronize()
                results[name][mode].update(first_call_s=first, times_s=[], cpu_s=[])
                print(f"[{name}] {mode}: first call (compile/warm-up) {first:.2f}s")
                sys.stdout.flush()
            except Exception as error:
                fail(name, mode, error)
        time_interleaved(
            steps, args.repeats, lambda name: timed(steps[name])[1:], lambda name: results[name][mode],
            lambda name, error: fail(name, mode, error),
        )
        for name in steps:
            entry = results[name][mode]
            summarise(entry)
            entry["tflops"] = step_flops[mode] / entry["median_s"] / 1e12
            entry["mfu"] = entry["tflops"] * 1e12 / peak if peak else None
            print(
                f"[{name}] {mode:9s} median {entry['median_s'] * 1e3:.1f} ms, min {entry['min_s'] * 1e3:.1f} ms, "
                f"median process CPU {entry['cpu_median_s'] * 1e3:.1f} ms over {len(entry['times_s'])}, "
                f"{entry['tflops']:.3g} TFLOP/s (MFU {fmt_percent(entry['mfu'])}); "
                f"all: {', '.join(f'{t * 1e3:.0f}' for t in entry['times_s'])}"
            )
        sys.stdout.flush()
        steps.clear()
        gc.collect()
        if device == "cuda" and backend == "torch":
            import torch

            torch.cuda.empty_cache()

    print(
        f"\n## {label}: batch {args.batch_size}, seq_len {args.seq_len}, {precision}, "
        f"median of {args.repeats} (ms per step)\n"
    )
    columns = (
        "first call s", "median ms", "min ms", "CPU ms", "ratio (median)", "ratio (min)", "ratio (paired)",
        "TFLOP/s", "MFU",
    )
    print("| contender | " + " | ".join(f"{m} {c}" for m in modes for c in columns) + " |")
    print("|" + "---|" * (1 + len(columns) * len(modes)))
    for name, entry in results.items():
        cells = []
        for mode in modes:
            if mode not in entry:
                cells += ["-"] * len(columns)  # not timed in this mode
                continue
            if "median_s" not in entry[mode]:
                cells += ["failed"] + ["-"] * (len(columns) - 1)
                continue
            e = entry[mode]
            cells.append(f"{e['first_call_s']:.2f}")
            cells += [fmt_ms(e[k]).strip() for k in ("median_s", "min_s", "cpu_median_s")]
            cells += ratio_cells(e, results.get("ours", {}).get(mode))
            cells += [f"{e['tflops']:.3g}", fmt_percent(e["mfu"])]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(
        "\nfirst call s = the first call alone (compilation, recording, warm-up), not in the other columns."
        "\nratio = contender / ours (> 1: ours faster): of the medians, of the minima, and 'paired', the median"
        "\nover rounds of the per-round ratio (the contenders run back to back in each round, so this one"
        "\ncancels load that changes between rounds). CPU ms = median process CPU time (all threads"
        + ("; on CUDA it includes the wait for the device)." if device == "cuda" and backend == "torch" else ").")
        + "\nTFLOP/s = model FLOPs of the step / median time: per layer and token 2 (4 d^2 + 2 d d_ff) + 4 S d"
        "\n(the matmuls; padded positions counted, embeddings, pooler, norms and softmax left out), a training"
        "\nstep 3x the forward: "
        + ", ".join(f"{mode} {flops / 1e12:.3g} TFLOP per step" for mode, flops in step_flops.items())
        + ".\nMFU = TFLOP/s / peak"
        + (f" ({peak / 1e12:g} TFLOP/s, {peak_source})." if peak else f": '-', {peak_source}.")
    )
    optimizers = [f"{name}: {entry['training']['optimizer']}" for name, entry in results.items()
                  if "optimizer" in entry.get("training", {})]
    if optimizers:
        print(f"training optimizers (learning rate {LEARNING_RATE:g}): " + "; ".join(optimizers))
    print(load_line("end"))

    if args.json:
        payload = {
            "backend": backend,
            "label": label,
            "device": description,
            "dtype": args.dtype,
            "cpu": cpu_model(),
            "threads": args.threads,
            "versions": versions(backend),
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "jit_compile": args.jit_compile,
            "outputs": args.outputs,
            "padding": not args.no_padding,
            "model_flops": step_flops,
            "peak_flops": peak,
            "peak_source": peak_source,
            "load_average_end": load_average(),
            "results": results,
        }
        write_json(args.json, payload)
    failed = [name for name, entry in results.items() if any("error" in e for e in entry.values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
