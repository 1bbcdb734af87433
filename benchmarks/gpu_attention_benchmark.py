"""On a GPU: proves which attention kernel our softmax attention reaches, and
times it, a BERT-base forward and GPT-2-small generation against Hugging Face
transformers (torch) in the same process.

The Keras backend is the one KERAS_BACKEND names (jax or torch; TensorFlow is
not covered: a TensorFlow GPU build is not available where this was run). Run
one process per backend (``bash benchmarks/run.sh gpu_attention``). Weights
are random: nothing is downloaded. On a machine without a GPU the script
still runs (the smoke test, --tiny), and says that no fused GPU kernel can run.

Parts (``--parts``):

* ``kernels``: for each dtype (bfloat16, float16, float32) and each mask form
  our layers pass (none; a padding mask ``(B, 1, 1, S)`` as
  ``MultiHeadAttention`` passes BERT's; ``is_causal``; causal + padding as in
  GPT), which kernel runs for

  - ``ours``: ``attention_zoo_keras.attention.softmax.softmax_attention``
    (it calls ``keras.ops.dot_product_attention(q, k, v, mask=mask)``),
  - ``fused-form``: the same attention with the mask brought to the form the
    fused kernels take (see ``fused_form_softmax_attention``): on JAX a mask
    broadcast to ``(…, T, S)``; a causal mask without padding passed as
    ``is_causal=True`` rather than as a boolean mask (both backends),
  - ``fused-form-auto`` (torch only): ``fused-form`` with
    ``flash_attention=False``, so that Keras does not pin SDPA to
    FlashAttention and torch's own priority (cuDNN attention on Hopper)
    picks,
  - ``native``: the backend's own fused call, as a library would write it
    (JAX: ``jax.nn.dot_product_attention(implementation="cudnn")`` with
    ``key_value_seq_lengths`` for padding; torch:
    ``torch.nn.functional.scaled_dot_product_attention`` with a boolean mask
    or ``is_causal``).

  Evidence on JAX: the compiled HLO of the ``jax.jit`` of the call (the
  program that runs): a ``custom_call_target="__cudnn$fmha…"`` is cuDNN's
  fused attention; without one, XLA runs the attention as cuBLAS matrix
  products and fusions. Keras' own fallback messages (it tries cuDNN, logs
  the exception and falls back to XLA) are captured and shown. Evidence on
  torch: ``torch.profiler`` — the ``aten::_scaled_dot_product_*`` operator
  dispatched and the CUDA kernels that ran — and, for our call, the reasons
  ``torch.backends.cuda.can_use_flash_attention(…, debug=True)`` gives on the
  very tensors Keras hands to SDPA. The same evidence is taken for a whole
  BERT forward (how many fused attention calls per forward).
* ``attention``: times the three calls above per dtype (bfloat16, float32),
  mask form and sequence length (batch 8, 12 heads of 64); relative error
  against a float64 reference at the first length.
* ``bert``: a BERT-base ``BertBackbone`` forward (random weights, batch 8,
  seq 128 and 512, rows of random length in [L/2, L], ``dtype`` bfloat16 or
  float32 for every layer) — ours as is, ours with ``attention=
  "softmax_fused_form"`` (the variant above, registered by this script), and
  ``transformers.BertModel`` (``attn_implementation="sdpa"``, same config,
  ``.to(dtype)``). Ours: JAX a ``jax.jit`` of ``model.stateless_call``;
  torch eager ``model(inputs)`` under ``torch.no_grad()``. HF eager under
  ``torch.no_grad()``. Outputs stay on the device.
* ``gpt``: GPT-2-small greedy generation (prompt 32, 128 new tokens, batch 1
  and 8, bfloat16): ``GPTCausalLM.generate`` against
  ``GPT2LMHeadModel.generate`` (sdpa, ``min_new_tokens=max_new_tokens``).

Timing: each callable is warmed up (compiled), then ``--repeats`` samples
are taken round-robin across the contenders of one row; a sample runs the
call ``n`` times back to back (``n`` chosen so that a sample lasts about
``--sample-ms``) and waits for the device (``jax.block_until_ready`` /
``torch.cuda.synchronize``) before reading the clock. Reported: the median
time per call, and ratios other / ours (> 1: ours faster), the paired ratio
being the median over rounds of each round's ratio.

Example::

    KERAS_BACKEND=jax python -m benchmarks.gpu_attention_benchmark --json out_jax.json
    KERAS_BACKEND=torch python -m benchmarks.gpu_attention_benchmark --tiny   # smoke test (CPU is fine)
"""

import argparse
import collections
import json
import logging
import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
import warnings

# Shared helpers and the other benchmarks' models (stdlib-only at import time,
# so they run before numpy/Keras).
from benchmarks.bert_benchmark import BERT_BASE
from benchmarks.bert_benchmark import make_inputs as bert_inputs
from benchmarks.bert_benchmark import transformers_bert
from benchmarks.contenders import record_failure
from benchmarks.contenders import round_robin
from benchmarks.gpt_generation_benchmark import GPT2_SMALL
from benchmarks.gpt_generation_benchmark import transformers_gpt2
from benchmarks.timing import cpu_model
from benchmarks.timing import paired_ratio
from benchmarks.timing import versions

# JAX and torch share the GPU in one process: JAX must not take 75% of it.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TINY_BERT = dict(BERT_BASE, num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=256)
TINY_GPT = dict(GPT2_SMALL, vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=256)
MASK_FORMS = ("none", "padding", "causal", "causal+padding")
CALLS = ("ours", "fused-form", "native")
TORCH_CALLS = ("ours", "fused-form", "fused-form-auto", "native")


def accelerator(backend):
    """`"gpu"`, `"tpu"` or `"cpu"`: where `backend` places new tensors."""
    if backend == "jax":
        import jax

        return jax.default_backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def fused_attention_kernel(backend):
    """Names the kernel `keras.ops.dot_product_attention` runs on this machine
    under `backend`.

    Keras dispatches to the backend's own fused implementation; on GPU it
    may further pick a flash-attention kernel. JAX: cuDNN's fused attention
    for fp16/bf16 only, and only when the mask is absent or already
    `(..., T, S)` (cuDNN takes the mask as a bias of exactly `(T, S)`; a
    broadcastable `(B, 1, 1, S)` mask makes Keras fall back to XLA's unfused
    attention, which `mask_for_fused_attention` avoids); float32 always runs
    on XLA. torch: SDPA picks FlashAttention,
    cuDNN or memory-efficient attention (float32 too).
    """
    device = accelerator(backend)
    if backend == "jax":
        kernel = "jax.nn.dot_product_attention"
        if device != "gpu":
            return f"{kernel} (xla)"
        return f"{kernel} (cudnn fused attention for fp16/bf16 with no mask or a (..., T, S) mask; xla otherwise)"
    if backend == "torch":
        return f"torch.nn.functional.scaled_dot_product_attention ({device})"
    if backend == "tensorflow":
        return f"keras tensorflow dot_product_attention ({device}, xla-fusable)"
    return "keras.ops.dot_product_attention"


def calls_for(backend):
    """The attention calls compared on `backend` (fused-form-auto differs
    from fused-form on torch only)."""
    return TORCH_CALLS if backend == "torch" else CALLS


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="kernels,attention,bert,gpt", help="comma-separated subset")
    parser.add_argument("--kernel-dtypes", default="bfloat16,float16,float32")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="dtypes timed (attention, bert)")
    parser.add_argument("--mask-forms", default=",".join(MASK_FORMS))
    parser.add_argument("--attn-batch", type=int, default=8)
    parser.add_argument("--attn-heads", type=int, default=12)
    parser.add_argument("--attn-head-dim", type=int, default=64)
    parser.add_argument("--attn-seq-lens", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--bert-batch", type=int, default=8)
    parser.add_argument("--bert-seq-lens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--gpt-batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--gpt-dtypes", default="bfloat16")
    parser.add_argument("--gpt-prompt-len", type=int, default=32)
    parser.add_argument("--gpt-new-tokens", type=int, default=128)
    parser.add_argument("--gpt-repeats", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7, help="timed samples per contender (median)")
    parser.add_argument("--sample-ms", type=float, default=25.0, help="target length of one timed sample")
    parser.add_argument("--tiny", action="store_true", help="small shapes: a smoke test of the script")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.tiny:
        args.attn_batch, args.attn_heads, args.attn_seq_lens = 2, 2, [64]
        args.bert_batch, args.bert_seq_lens = 2, [32]
        args.gpt_batch_sizes, args.gpt_new_tokens, args.gpt_prompt_len = [2], 8, 8
        args.repeats, args.gpt_repeats, args.sample_ms = 2, 1, 2.0
    return args


# =========================================================================== backend plumbing


class Runtime:
    """What differs between the backends: placing arrays, waiting for the
    device, compiling a call."""

    def __init__(self):
        import keras

        self.backend = keras.backend.backend()
        if self.backend not in ("jax", "torch"):
            raise SystemExit(f"KERAS_BACKEND={self.backend}: this benchmark covers jax and torch")
        import torch

        self.torch = torch
        self.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.backend == "jax":
            import jax

            self.jax = jax
            self.gpu = jax.default_backend() == "gpu"
        else:
            self.gpu = torch.cuda.is_available()

    def array(self, x, dtype=None):
        """numpy → a tensor of the Keras backend on its default device."""
        import keras

        return keras.ops.convert_to_tensor(x, dtype=dtype)

    def torch_array(self, x, dtype=None):
        t = self.torch.from_numpy(x).to(self.torch_device)
        return t if dtype is None else t.to(getattr(self.torch, dtype))

    def sync_keras(self, out):
        if self.backend == "jax":
            self.jax.block_until_ready(out)
        elif self.torch_device == "cuda":
            self.torch.cuda.synchronize()

    def sync_torch(self, out=None):
        if self.torch_device == "cuda":
            self.torch.cuda.synchronize()

    def compile(self, fn):
        """`fn` as it is timed: jax.jit on JAX, eager under no_grad on torch."""
        if self.backend == "jax":
            return self.jax.jit(fn)
        torch = self.torch

        def no_grad(*args):
            with torch.no_grad():
                return fn(*args)

        return no_grad


class KerasFallbackRecorder(logging.Filter):
    """Keras' JAX `dot_product_attention` tries cuDNN, and on an exception
    logs it with `absl.logging.exception` and falls back to XLA. This filter
    (on the `absl` logger) records those messages instead of printing their
    tracebacks."""

    def __init__(self):
        super().__init__()
        self.records = []

    def filter(self, record):
        message = record.getMessage()
        if "dot_product_attention" in message or "flash attention" in message.lower():
            error = record.exc_info[1] if record.exc_info else None
            self.records.append(message + (f" -> {type(error).__name__}: {error}" if error else ""))
            return False
        return True

    def take(self):
        records, self.records = self.records, []
        return records


def short(text, n=110):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


# =========================================================================== attention variants


def fused_form_softmax_attention(
    query, key, value, attention_mask=None, is_causal=False, dropout_rate=0.0,
    training=False, seed_generator=None, scale=None, flash_attention=None,
):
    """`softmax_attention` with its mask in the form the fused kernels take
    (the change this benchmark measures; same results):

    * a causal mask with no other mask, over as many keys as queries, goes
      to `keras.ops.dot_product_attention` as `is_causal=True` (cuDNN's
      causal mask type on JAX; FlashAttention on torch, which takes no
      `attn_mask`), not as a boolean `(T, S)` mask;
    * on JAX any other mask is broadcast to `(…, T, S)`: cuDNN's fused
      attention (jax's `check_layout`) needs a bias whose last two dimensions
      are exactly `(T, S)`, so the `(B, 1, 1, S)` padding mask our layers
      pass makes Keras fall back to XLA's unfused attention.

    `flash_attention` goes to `keras.ops.dot_product_attention` (the
    ``fused-form-auto`` call passes False on torch: see `make_call`).
    """
    from keras import ops

    from attention_zoo_keras import backend_support
    from attention_zoo_keras.attention.softmax import softmax_attention

    if training and dropout_rate > 0.0:
        return softmax_attention(
            query, key, value, attention_mask, is_causal, dropout_rate, training, seed_generator, scale
        )
    query_length, key_length = query.shape[1], key.shape[1]
    if attention_mask is None and is_causal and query_length is not None and query_length == key_length:
        return ops.dot_product_attention(
            query, key, value, scale=scale, is_causal=True, flash_attention=flash_attention
        )
    if query_length is None:
        query_length = ops.shape(query)[1]
    if key_length is None:
        key_length = ops.shape(key)[1]
    mask = attention_mask
    if is_causal:
        from attention_zoo_keras.attention.masks import causal_mask

        causal = causal_mask(query_length, key_length)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    if mask is not None:
        mask = ops.cast(mask, "bool")
        if backend_support.backend_name() == "jax" and (mask.shape[-2] != query_length or mask.shape[-1] != key_length):
            mask = ops.broadcast_to(mask, tuple(mask.shape[:-2]) + (query_length, key_length))
    return ops.dot_product_attention(query, key, value, mask=mask, scale=scale, flash_attention=flash_attention)


def register_fused_form():
    from attention_zoo_keras.attention.registry import register_decoding
    from attention_zoo_keras.attention.registry import register_mechanism
    from attention_zoo_keras.attention.decoding import KeyValueCache
    from attention_zoo_keras.attention.decoding import attend_over_cache

    register_mechanism("softmax_fused_form")(fused_form_softmax_attention)
    register_decoding("softmax_fused_form", KeyValueCache(attend_over_cache(fused_form_softmax_attention)))


def attention_inputs(rt, batch, length, heads, head_dim, dtype, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((batch, length, heads, head_dim)).astype("float32") for _ in range(3))
    lengths = rng.integers(length // 2, length + 1, size=(batch,))
    lengths[0] = length
    padding = (np.arange(length)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    return {"q": q, "k": k, "v": v, "padding": padding, "lengths": lengths.astype("int32"), "dtype": dtype}


def make_call(rt, call, form, dtype):
    """`(fn, args)`: `fn(*args)` computes the attention `call` under mask
    `form` in `dtype`; args are backend tensors (built by `call_args`)."""
    causal = form.startswith("causal")
    padded = form.endswith("padding")
    if call in ("ours", "fused-form", "fused-form-auto"):
        from attention_zoo_keras.attention.softmax import softmax_attention

        mechanism = softmax_attention if call == "ours" else fused_form_softmax_attention
        # fused-form-auto (torch only): flash_attention=False, so that Keras
        # does not restrict SDPA to FlashAttention (`sdpa_kernel([FLASH_ATTENTION])`)
        # where FlashAttention can run, and torch's own priority picks.
        extra = {"flash_attention": False} if call == "fused-form-auto" else {}

        def fn(q, k, v, mask, lengths):
            return mechanism(q, k, v, attention_mask=mask if padded else None, is_causal=causal, **extra)

        return fn
    if rt.backend == "jax":
        import jax

        def fn(q, k, v, mask, lengths):
            kw = dict(is_causal=causal)
            if padded:
                kw["key_value_seq_lengths"] = lengths
            impl = "cudnn" if rt.gpu and dtype != "float32" else None  # cuDNN takes fp16/bf16 only
            return jax.nn.dot_product_attention(q, k, v, implementation=impl, **kw)

        return fn
    import torch.nn.functional as F

    def fn(q, k, v, mask, lengths):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attn_mask = None
        if padded:
            attn_mask = mask
            if causal:
                length = q.shape[2]
                attn_mask = attn_mask & torch_tril(length, mask.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal and not padded)
        return out.transpose(1, 2)

    return fn


def torch_tril(length, device):
    import torch

    return torch.tril(torch.ones((length, length), dtype=torch.bool, device=device))


def call_args(rt, data):
    return (
        rt.array(data["q"], data["dtype"]),
        rt.array(data["k"], data["dtype"]),
        rt.array(data["v"], data["dtype"]),
        rt.array(data["padding"]),
        rt.array(data["lengths"]),
    )


def reference_attention(rt, data, form):
    """float64 reference (torch, on the GPU where there is one) as numpy."""
    import numpy as np
    import torch

    q, k, v = (torch.from_numpy(data[n]).to(rt.torch_device, torch.float64).transpose(1, 2) for n in "qkv")
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    length = q.shape[2]
    allowed = torch.ones((1, 1, length, length), dtype=torch.bool, device=q.device)
    if form.endswith("padding"):
        allowed = allowed & torch.from_numpy(data["padding"]).to(q.device)
    if form.startswith("causal"):
        allowed = allowed & torch_tril(length, q.device)
    logits = logits.masked_fill(~allowed, -np.inf)
    out = torch.softmax(logits, dim=-1) @ v
    return out.transpose(1, 2).cpu().numpy()


def relative_error(out, ref):
    import keras
    import numpy as np

    out = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")), dtype="float64")
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


# =========================================================================== kernel evidence


def jax_evidence(fn, args):
    """What the compiled program of `jax.jit(fn)(*args)` runs."""
    import jax

    text = jax.jit(fn).lower(*args).compile().as_text()
    targets = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
    fmha = {t: n for t, n in targets.items() if "fmha" in t.lower() or "flash" in t.lower()}
    fusions = len(re.findall(r"^\s*\S+ = \S+ fusion\(", text, flags=re.M))
    if fmha:
        kernel = "cuDNN fused attention"
        evidence = ", ".join(f"{t} x{n}" for t, n in sorted(fmha.items()))
    else:
        kernel = "XLA, unfused" if rt_is_gpu_jax() else "XLA (CPU)"
        others = ", ".join(f"{t} x{n}" for t, n in sorted(targets.items())) or "none"
        evidence = f"no __cudnn$fmha custom call; {fusions} XLA fusions (matmuls, softmax); custom calls: {others}"
    return {"kernel": kernel, "evidence": evidence, "custom_calls": dict(targets), "fusions": fusions}


def rt_is_gpu_jax():
    import jax

    return jax.default_backend() == "gpu"


SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "FlashAttention",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient (CUTLASS)",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_attention_math": "math (unfused)",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (overrideable)",
}


def classify_cuda_kernel(name):
    low = name.lower()
    if "flash" in low:
        return "flash"
    if "fmha" in low or "efficient" in low or "cutlassf" in low:
        return "mem-efficient"
    if "cudnn" in low or "sdpa" in low:
        return "cudnn"
    if "softmax" in low:
        return "softmax"
    if "gemm" in low or "sm90_xmma" in low or "cutlass" in low or "nvjet" in low:
        return "matmul"
    return "other"


def torch_evidence(fn, args, sync):
    """`torch.profiler` of one call: the SDPA operator dispatched and the
    CUDA kernels that ran."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch.no_grad(), profile(activities=activities) as prof:
        out = fn(*args)
        sync(out)
    ops = collections.Counter()
    kernels = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] += 1
        elif event.name in SDPA_OPS:
            ops[event.name] += 1
    classes = collections.Counter()
    for name, n in kernels.items():
        classes[classify_cuda_kernel(name)] += n
    dispatched = [SDPA_OPS[o] for o in ops]
    fused_kernels = [k for k in kernels if classify_cuda_kernel(k) in ("flash", "mem-efficient", "cudnn")]
    if dispatched:
        kernel = " + ".join(sorted(set(dispatched)))
    elif classes.get("softmax"):
        kernel = "unfused (matmul + softmax)"
    else:
        kernel = "?"
    evidence = ", ".join(f"{o.replace('aten::', '')} x{n}" for o, n in ops.items())
    if fused_kernels:
        evidence += "; kernels: " + ", ".join(short(k, 60) for k in fused_kernels[:2])
    elif kernels:
        evidence += "; kernel classes: " + ", ".join(f"{c} x{n}" for c, n in classes.most_common())
    return {
        "kernel": kernel, "evidence": evidence.strip("; "), "sdpa_ops": dict(ops),
        "cuda_kernel_classes": dict(classes), "cuda_kernels": dict(kernels),
    }


def torch_sdpa_eligibility(rt, data, form, dtype):
    """Which SDPA backends accept the tensors Keras' torch
    `dot_product_attention` hands to SDPA for our call (transposed to
    (B, N, T, H), a boolean mask turned into an additive float mask), with
    torch's reasons for those that do not."""
    import torch

    if not torch.cuda.is_available():
        return {}
    from torch.backends.cuda import SDPAParams

    q, k, v = (rt.torch_array(data[n], dtype).transpose(1, 2) for n in "qkv")
    length = q.shape[2]
    mask = None
    if form != "none":
        allowed = torch.ones((length, length), dtype=torch.bool, device=q.device)
        if form.endswith("padding"):
            allowed = torch.from_numpy(data["padding"]).to(q.device) & allowed[None, None]
        if form.startswith("causal"):
            allowed = allowed & torch_tril(length, q.device)
        if not form.endswith("padding"):
            allowed = allowed  # (T, S), as `causal_mask` makes it
        mask = torch.where(allowed, 0.0, -1e9 if dtype != "float16" else -3e4).to(q.dtype)
    try:
        params = SDPAParams(q, k, v, mask, 0.0, False, False)
    except TypeError:
        params = SDPAParams(q, k, v, mask, 0.0, False)
    result = {}
    for name in ("flash", "efficient", "cudnn"):
        check = getattr(torch.backends.cuda, f"can_use_{name}_attention", None)
        if check is None:
            continue
        # debug=True: torch prints its reason on stderr (a C++ warning, "[W… sdp_utils…]").
        result[name] = "yes" if bool(check(params, True)) else "no (torch's reason: the sdp_utils warning above)"
    return result


def kernel_part(rt, args, results, recorder):
    print("\n# Part 1: which attention kernel runs (one call, batch "
          f"{args.attn_batch}, seq {args.attn_seq_lens[0]}, {args.attn_heads} heads of {args.attn_head_dim})")
    rows = []
    length = args.attn_seq_lens[0]
    for dtype in args.kernel_dtypes.split(","):
        if rt.backend == "jax" and not rt.gpu and dtype == "float16":
            print("  float16 skipped: XLA on the CPU has no float16 dot_general")
            continue
        data = attention_inputs(rt, args.attn_batch, length, args.attn_heads, args.attn_head_dim, dtype)
        tensors = call_args(rt, data)
        for form in args.mask_forms.split(","):
            for call in calls_for(rt.backend):
                row = {"dtype": dtype, "mask": form, "call": call}
                try:
                    fn = make_call(rt, call, form, dtype)
                    recorder.take()
                    if rt.backend == "jax":
                        row.update(jax_evidence(fn, tensors))
                    else:
                        row.update(torch_evidence(fn, tensors, rt.sync_torch))
                        if call == "ours":
                            row["sdpa_eligibility"] = torch_sdpa_eligibility(rt, data, form, dtype)
                    row["keras_fallback"] = recorder.take()
                except Exception as error:  # report and go on
                    row.update(kernel="FAILED", evidence=short(f"{type(error).__name__}: {error}", 200))
                    row["traceback"] = traceback.format_exc()
                rows.append(row)
                print(f"  {dtype:8s} {form:15s} {call:10s} -> {row['kernel']}: {short(row['evidence'], 140)}")
                for message in row.get("keras_fallback", [])[:1]:
                    print(f"      keras fallback: {short(message, 220)}")
                for name, verdict in row.get("sdpa_eligibility", {}).items():
                    if verdict != "yes":
                        print(f"      SDPA {name}: {verdict}")
                sys.stdout.flush()
    results["kernels"] = rows


# =========================================================================== timing


def calibrate(fn, sync, target_s):
    start = time.perf_counter()
    sync(fn())
    once = time.perf_counter() - start
    return max(1, min(1000, int(math.ceil(target_s / max(once, 1e-6)))))


def time_contenders(contenders, repeats, target_s, warmup=2):
    """`contenders`: name -> (fn, sync). Returns name -> {median_s, times_s,
    first_s}: per-call seconds; samples taken round-robin."""
    out = {}
    for name, (fn, sync) in contenders.items():
        start = time.perf_counter()
        sync(fn())
        first = time.perf_counter() - start
        for _ in range(warmup - 1):
            sync(fn())
        n = calibrate(fn, sync, target_s) if target_s > 0 else 1
        out[name] = {"first_s": first, "n": n, "times_s": []}
    for order in round_robin(contenders, repeats):
        for name in order:
            fn, sync = contenders[name]
            n = out[name]["n"]
            start = time.perf_counter()
            result = None
            for _ in range(n):
                result = fn()
            sync(result)
            out[name]["times_s"].append((time.perf_counter() - start) / n)
    for entry in out.values():
        entry["median_s"] = statistics.median(entry["times_s"])
        entry["min_s"] = min(entry["times_s"])
    return out


def attention_part(rt, args, results, recorder):
    print(f"\n# Part 2: attention call time (batch {args.attn_batch}, {args.attn_heads} heads of {args.attn_head_dim})")
    rows = []
    for dtype in args.dtypes.split(","):
        for index, length in enumerate(args.attn_seq_lens):
            data = attention_inputs(rt, args.attn_batch, length, args.attn_heads, args.attn_head_dim, dtype, seed=1)
            tensors = call_args(rt, data)
            for form in args.mask_forms.split(","):
                row = {"dtype": dtype, "seq_len": length, "mask": form}
                try:
                    contenders = {}
                    for call in calls_for(rt.backend):
                        compiled = rt.compile(make_call(rt, call, form, dtype))
                        contenders[call] = (lambda c=compiled: c(*tensors), rt.sync_keras)
                    if index == 0:
                        ref = reference_attention(rt, data, form)
                        row["rel_err"] = {c: relative_error(f(), ref) for c, (f, _) in contenders.items()}
                    row["timing"] = time_contenders(contenders, args.repeats, args.sample_ms / 1e3)
                    row["keras_fallback"] = sorted(set(recorder.take()))
                except Exception as error:
                    record_failure(row, error)
                rows.append(row)
                print_attention_row(row)
                sys.stdout.flush()
            tensors = None  # (the contenders' lambdas read it until here)
    results["attention"] = rows


def print_attention_row(row):
    if "error" in row:
        print(f"  {row['dtype']:8s} L={row['seq_len']:5d} {row['mask']:15s} FAILED {short(row['error'])}")
        return
    t = row["timing"]
    ours = t["ours"]
    cells = [f"{c} {e['median_s'] * 1e3:8.3f} ms" for c, e in t.items()]
    ratios = [f"{c}/ours {paired_ratio(e['times_s'], ours['times_s']):.2f}" for c, e in t.items() if c != "ours"]
    err = ""
    if "rel_err" in row:
        err = " rel.err " + " ".join(f"{v:.1e}" for v in row["rel_err"].values())
    head = f"  {row['dtype']:8s} L={row['seq_len']:5d} {row['mask']:15s} "
    print(head + " | ".join(cells) + " | " + ", ".join(ratios) + err)


# --------------------------------------------------------------------------- BERT


def ours_bert_forward(rt, config, dtype, attention, inputs):
    """`(forward(), model_fn, args)`: the timed forward of our BertBackbone
    and the pieces for the kernel evidence."""
    from attention_zoo_keras.models import BertBackbone

    model = BertBackbone(**config, dtype=dtype, attention=attention)
    tensors = {k: rt.array(v) for k, v in inputs.items()}
    if rt.backend == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]

        def stateless(trainable, non_trainable, tensors):
            outputs, _ = model.stateless_call(trainable, non_trainable, tensors, training=False)
            return outputs

        jitted = jax.jit(stateless)
        args = (trainable, non_trainable, tensors)
        return (lambda: jitted(*args)), stateless, args
    import torch

    def forward():
        with torch.no_grad():
            return model(tensors, training=False)

    return forward, None, None


def hf_bert(rt, config, dtype, inputs):
    import torch

    model = transformers_bert(config).to(rt.torch_device, getattr(torch, dtype)).eval()
    tensors = {
        "input_ids": rt.torch_array(inputs["token_ids"]).long(),
        "token_type_ids": rt.torch_array(inputs["segment_ids"]).long(),
        "attention_mask": rt.torch_array(inputs["padding_mask"]).long(),
    }

    def forward():
        with torch.no_grad():
            return model(**tensors).last_hidden_state

    return forward


def bert_evidence(rt, name, forward, stateless, args):
    if name != "transformers" and rt.backend == "jax":
        return jax_evidence(stateless, args)
    sync = rt.sync_torch
    return torch_evidence(lambda: forward(), (), sync)


def bert_part(rt, args, results, recorder):
    import gc

    config = TINY_BERT if args.tiny else BERT_BASE
    print(f"\n# Part 3: BERT forward (batch {args.bert_batch}, {config['num_layers']} layers, "
          f"hidden {config['hidden_dim']}, padded rows)")
    rows = []
    for dtype in args.dtypes.split(","):
        for length in args.bert_seq_lens:
            inputs = bert_inputs(args.bert_batch, length, config["vocabulary_size"], no_padding=False)
            row = {"dtype": dtype, "seq_len": length, "kernels": {}}
            try:
                contenders, pieces = {}, {}
                for name, attention in (("ours", "softmax"), ("fused-form", "softmax_fused_form")):
                    forward, stateless, fargs = ours_bert_forward(rt, config, dtype, attention, inputs)
                    contenders[name] = (forward, rt.sync_keras)
                    pieces[name] = (forward, stateless, fargs)
                hf_forward = hf_bert(rt, config, dtype, inputs)
                contenders["transformers"] = (hf_forward, rt.sync_torch)
                pieces["transformers"] = (hf_forward, None, None)
                for name, (forward, stateless, fargs) in pieces.items():
                    recorder.take()
                    evidence = bert_evidence(rt, name, forward, stateless, fargs)
                    evidence = {k: evidence[k] for k in ("kernel", "evidence")}
                    evidence["keras_fallback"] = sorted(set(recorder.take()))
                    row["kernels"][name] = evidence
                row["timing"] = time_contenders(contenders, args.repeats, args.sample_ms / 1e3)
                recorder.take()
            except Exception as error:
                record_failure(row, error)
            rows.append(row)
            print_bert_row(row)
            contenders = pieces = None
            gc.collect()
            if rt.torch_device == "cuda":
                rt.torch.cuda.empty_cache()
    results["bert"] = rows


def print_bert_row(row):
    if "error" in row:
        print(f"  {row['dtype']:8s} L={row['seq_len']:4d} FAILED {short(row['error'])}")
        return
    t = row["timing"]
    cells = [f"{c} {e['median_s'] * 1e3:7.2f} ms" for c, e in t.items()]
    ratios = [f"{c}/ours {paired_ratio(e['times_s'], t['ours']['times_s']):.2f}" for c, e in t.items() if c != "ours"]
    print(f"  {row['dtype']:8s} L={row['seq_len']:4d} " + " | ".join(cells) + " | " + ", ".join(ratios))
    for name, ev in row["kernels"].items():
        print(f"      {name:12s} attention: {ev['kernel']}: {short(ev['evidence'], 150)}")
        for message in ev.get("keras_fallback", [])[:1]:
            print(f"      {'':12s} keras fallback: {short(message, 200)}")


# --------------------------------------------------------------------------- GPT-2


def gpt_part(rt, args, results, recorder):
    import gc

    import numpy as np
    import torch

    from attention_zoo_keras.models import GPTBackbone
    from attention_zoo_keras.models import GPTCausalLM

    config = TINY_GPT if args.tiny else GPT2_SMALL
    new = args.gpt_new_tokens
    print(f"\n# Part 4: GPT-2 greedy generation (prompt {args.gpt_prompt_len}, {new} new tokens)")
    rows = []
    for dtype in args.gpt_dtypes.split(","):
        try:
            backbone = GPTBackbone(**config, dropout=0.0, attention_dropout=0.0, dtype=dtype)
            lm = GPTCausalLM(backbone=backbone, preprocessor=None)
            hf = transformers_gpt2(config).to(rt.torch_device, getattr(torch, dtype)).eval()
        except Exception as error:
            rows.append({"dtype": dtype})
            record_failure(rows[-1], error)
            continue
        for batch in args.gpt_batch_sizes:
            rng = np.random.default_rng(batch)
            prompts = rng.integers(1, config["vocabulary_size"] - 1, size=(batch, args.gpt_prompt_len)).astype("int32")
            row = {"dtype": dtype, "batch": batch}
            try:
                def ours():
                    out = lm.generate(
                        {"token_ids": prompts, "padding_mask": np.ones_like(prompts)},
                        max_new_tokens=new, stop_token_ids=None,
                    )
                    return out["token_ids"]

                hf_ids = rt.torch_array(prompts).long()

                def theirs():
                    with torch.no_grad():
                        out = hf.generate(
                            hf_ids, attention_mask=torch.ones_like(hf_ids), max_new_tokens=new,
                            min_new_tokens=new, do_sample=False, num_beams=1, pad_token_id=0,
                        )
                    return out.cpu().numpy()

                first = {}
                for name, fn in (("ours", ours), ("transformers", theirs)):
                    start = time.perf_counter()
                    out = fn()
                    first[name] = time.perf_counter() - start  # compilation / warm-up
                    assert out.shape == (batch, args.gpt_prompt_len + new), out.shape
                    assert (out[:, : args.gpt_prompt_len] == prompts).all()
                contenders = {"ours": (ours, lambda out: None), "transformers": (theirs, lambda out: None)}
                row["timing"] = time_contenders(contenders, args.gpt_repeats, 0.0, warmup=1)
                for name, seconds in first.items():
                    row["timing"][name]["first_s"] = seconds
                recorder.take()
            except Exception as error:
                record_failure(row, error)
            rows.append(row)
            if "timing" in row:
                t = row["timing"]
                tok = {c: batch * new / e["median_s"] for c, e in t.items()}
                row["tokens_per_s"] = tok
                ratio = paired_ratio(t["transformers"]["times_s"], t["ours"]["times_s"])
                print(f"  {dtype:8s} batch {batch}: ours {tok['ours']:8.1f} tok/s, transformers "
                      f"{tok['transformers']:8.1f} tok/s, transformers/ours time {ratio:.2f} "
                      f"(first call: ours {t['ours']['first_s']:.1f}s)")
            else:
                print(f"  {dtype:8s} batch {batch}: FAILED {short(row.get('error'))}")
            sys.stdout.flush()
        lm = hf = backbone = None
        gc.collect()
    results["gpt"] = rows


# =========================================================================== summary tables


def summary(rt, args, results):
    print(f"\n## Summary ({rt.backend}, {results['device']})")
    if results.get("kernels"):
        print("\n| dtype | mask | call | kernel that ran | evidence |\n|---|---|---|---|---|")
        for r in results["kernels"]:
            ev = short(r["evidence"], 90)
            if r.get("keras_fallback"):
                ev += " (Keras logged a cuDNN failure and fell back)"
            print(f"| {r['dtype']} | {r['mask']} | {r['call']} | {r['kernel']} | {ev} |")
    if results.get("attention"):
        calls = calls_for(rt.backend)
        others = [c for c in calls if c != "ours"]
        print("\n| dtype | L | mask | " + " | ".join(f"{c} ms" for c in calls) + " | "
              + " | ".join(f"ours/{c}" for c in others) + " |\n|" + "---|" * (3 + len(calls) + len(others)))
        for r in results["attention"]:
            if "timing" not in r:
                continue
            t = r["timing"]
            cells = [f"{t[c]['median_s'] * 1e3:.3f}" for c in calls]
            cells += [f"{paired_ratio(t['ours']['times_s'], t[c]['times_s']):.2f}" for c in others]
            print(f"| {r['dtype']} | {r['seq_len']} | {r['mask']} | " + " | ".join(cells) + " |")
    if results.get("bert"):
        print("\n| dtype | L | ours ms | fused-form ms | transformers ms | transformers/ours | transformers/fused-form"
              " | attention kernel (ours; fused-form; transformers) |\n|---|---|---|---|---|---|---|---|")
        for r in results["bert"]:
            if "timing" not in r:
                continue
            t = r["timing"]
            ms = [t[x]["median_s"] * 1e3 for x in ("ours", "fused-form", "transformers")]
            k = "; ".join(short(r["kernels"][x]["kernel"], 40) for x in ("ours", "fused-form", "transformers"))
            print(f"| {r['dtype']} | {r['seq_len']} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[2]:.2f} | "
                  f"{paired_ratio(t['transformers']['times_s'], t['ours']['times_s']):.2f} | "
                  f"{paired_ratio(t['transformers']['times_s'], t['fused-form']['times_s']):.2f} | {k} |")
    if results.get("gpt"):
        print("\n| dtype | batch | ours tok/s | transformers tok/s | transformers/ours (time) |\n|---|---|---|---|---|")
        for r in results["gpt"]:
            if "timing" in r:
                t = r["timing"]
                print(f"| {r['dtype']} | {r['batch']} | {r['tokens_per_s']['ours']:.1f} | "
                      f"{r['tokens_per_s']['transformers']:.1f} | "
                      f"{paired_ratio(t['transformers']['times_s'], t['ours']['times_s']):.2f} |")


def device_name(rt):
    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} ({p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB)"
    return f"CPU only: {cpu_model()}"


def main(argv=None):
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    recorder = KerasFallbackRecorder()
    logging.getLogger("absl").addFilter(recorder)
    rt = Runtime()
    register_fused_form()
    from attention_zoo_keras import backend_support

    results = {
        "backend": rt.backend, "device": device_name(rt), "gpu": rt.gpu,
        "versions": versions(rt.backend, extra=["jax-cuda13-plugin", "jax-cuda12-plugin", "nvidia-cudnn-cu13"]),
        "python": platform.python_version(),
        "fused_attention_kernel": fused_attention_kernel(backend_support.backend_name()),
        "args": {k: v for k, v in vars(args).items()},
    }
    if rt.backend == "jax":
        import jax

        results["jax_devices"] = [str(d) for d in jax.devices()]
        results["jax_default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
        try:
            from jax._src.cudnn.fused_attention_stablehlo import check_cudnn_version

            results["cudnn_version"] = check_cudnn_version()
        except Exception as error:
            results["cudnn_version"] = f"unavailable ({type(error).__name__})"
    else:
        import torch

        results["cudnn_version"] = torch.backends.cudnn.version()
        results["torch_allow_tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    print(f"# GPU attention benchmark, KERAS_BACKEND={rt.backend}{' (TINY smoke test)' if args.tiny else ''}")
    print(f"device: {results['device']}; python {results['python']}; "
          + ", ".join(f"{k} {v}" for k, v in results["versions"].items()))
    print(f"cuDNN: {results['cudnn_version']}; fused attention kernel: "
          f"{results['fused_attention_kernel']}")
    if not rt.gpu:
        print("NOTE: no GPU for this backend: no fused GPU kernel can run; numbers are a smoke test only.")
    sys.stdout.flush()
    parts = {"kernels": kernel_part, "attention": attention_part, "bert": bert_part, "gpt": gpt_part}
    for part in args.parts.split(","):
        start = time.perf_counter()
        try:
            parts[part](rt, args, results, recorder)
        except Exception as error:  # one part failing leaves the others
            results[f"{part}_error"] = traceback.format_exc()
            print(f"[{part}] FAILED: {type(error).__name__}: {error}\n{traceback.format_exc()}")
        results.setdefault("part_seconds", {})[part] = time.perf_counter() - start
        print(f"[{part}] {time.perf_counter() - start:.0f}s")
        if args.json:  # write as we go: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=str)
    summary(rt, args, results)
    failed = [k for k in results if k.endswith("_error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
