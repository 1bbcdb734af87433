"""Helpers shared by the benchmark scripts: thread limits and the start of
the Keras backend, machine and version reports, the torch device of a run
(and waiting for it), load averages, peak-memory counters (and the peak
memory of one call), the peak rates of the GPUs we benchmark on (for MFU and
bandwidth utilization) and ratio/format helpers.

Only the standard library is imported at module level, so a script can
import this before it sets the thread environment variables and only then
imports numpy, Keras and the backends (`limit_threads` and
`choose_torch_device` must run first, or `start_backend`, which runs them
before it imports Keras; the backends are imported inside the functions
that need them).
"""

import ctypes
import gc
import json
import os
import platform
import statistics
import time


def limit_threads(threads):
    """Same thread budget for every library; must run before they are imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = str(threads)
    if threads == 1:
        # XLA:CPU (JAX, TF with jit_compile) has no "N threads" knob; it can only
        # be switched to one thread. With N > 1 it uses every core.
        flags = os.environ.get("XLA_FLAGS", "")
        one_thread = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        if one_thread not in flags:  # set once (a worker process inherits its parent's)
            os.environ["XLA_FLAGS"] = (flags + " " + one_thread).strip()


def apply_backend_threads(backend, threads):
    """The thread limits that TensorFlow and torch take through their APIs
    (call after importing Keras)."""
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass  # already set, or parallel work already started


def start_backend(threads, device=None):
    """Starts a run's Keras backend under a thread budget: `limit_threads`,
    then (with `device`, a `--device` value) `choose_torch_device`, then
    imports Keras and applies `apply_backend_threads`. Returns `(backend
    name, torch device)`, the device None without `device`. JAX and
    TensorFlow run on their default device: a `device` other than "auto" is
    refused for them."""
    limit_threads(threads)
    torch_device = choose_torch_device(device) if device is not None else None

    import keras

    backend = keras.backend.backend()
    apply_backend_threads(backend, threads)
    if device is not None and backend != "torch" and device != "auto":
        raise SystemExit(f"--device {device} is for the torch backend; {backend} runs on its default device")
    return backend, torch_device


def cpu_model():
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(backend, extra=()):
    """`{package: version}` of the installed packages a benchmark on
    `backend` depends on (plus the names in `extra`); missing ones are
    left out."""
    import importlib.metadata as md

    names = ["keras", "keras-hub", "numpy", "transformers", "torch"]
    names += {"jax": ["jax", "jaxlib"], "tensorflow": ["tensorflow", "tensorflow-cpu"]}.get(backend, [])
    names += list(extra)
    found = {}
    for name in names:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return found


def cpu_line(threads, per_library=False):
    """The header line that names the CPU, its cores and the thread budget."""
    budget = "threads per library" if per_library else "threads"
    return f"cpu: {cpu_model()} ({os.cpu_count()} logical cores), {budget}: {threads}"


def fmt_versions(found):
    """`"python X; name version, ..."` of a `versions()` dict."""
    return f"python {platform.python_version()}; " + ", ".join(f"{k} {v}" for k, v in found.items())


def load_average():
    """`os.getloadavg()` (1, 5, 15 minutes) as a list, for the JSON results."""
    return list(os.getloadavg())


def fmt_load(load):
    """A load average triple as `"a, b, c"`."""
    return ", ".join(f"{x:.2f}" for x in load)


def load_line(when, load=None):
    """`"load average at the <when> (1, 5, 15 min): a, b, c"`, of `load` or now."""
    return f"load average at the {when} (1, 5, 15 min): {fmt_load(load_average() if load is None else load)}"


def write_json(path, payload):
    """Writes a run's results, `payload`, as indented JSON to `path` (its
    `--json`); nothing where `path` is None."""
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)


def paired_ratio(times, reference_times):
    """Median over rounds of times[i] / reference_times[i]."""
    return statistics.median(t / r for t, r in zip(times, reference_times))


def fmt_ms(seconds):
    """Seconds as right-aligned milliseconds with one decimal."""
    return f"{seconds * 1e3:10.1f}"


def fmt_percent(fraction):
    """A fraction (of a peak) as a percentage with one decimal; "-" for None
    (no peak known)."""
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def _status_bytes(field):
    """A `kB` field of /proc/self/status (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss():
    """Starts a peak-memory measurement: collects Python's garbage, returns
    glibc's free heap pages to the kernel (`malloc_trim(0)`, so that memory
    freed earlier is not silently reused and missed) and resets the kernel's
    peak-RSS counter (`/proc/self/clear_refs`, value 5). Returns `(resident
    bytes now, method)`; where clear_refs is not writable the peak is
    `ru_maxrss`, the peak since the process started, and `method` says so.
    Read the peak with `peak_rss()`."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_bytes("VmRSS"), "VmHWM after clear_refs"
    except OSError:
        return _status_bytes("VmRSS"), "ru_maxrss (peak since process start)"


def peak_rss():
    """Peak resident bytes since the last `reset_peak_rss` (VmHWM), or since
    the process started where /proc/self/status has none."""
    try:
        return _status_bytes("VmHWM")
    except (OSError, KeyError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def call_memory(backend, call):
    """Runs `call()` once and measures its time and peak memory: `{"seconds",
    "peak_rss_bytes", "memory_method", "rss_before_bytes", "peak_bytes"}`.

    `peak_rss_bytes` is the process's peak resident memory during the call
    above its resident size before (`rss_before_bytes`; `reset_peak_rss`).
    That is the measure (`peak_bytes`) on JAX and torch, whose CPU buffers
    come from malloc and go back to the kernel when freed. TensorFlow's CPU
    allocator keeps freed memory in its own pool, so after a warm-up call
    the RSS barely moves; there `peak_bytes` is the allocator's own peak
    during the call above its use before
    (`tf.config.experimental.reset_memory_stats` and
    `get_memory_info("CPU:0")`)."""
    allocator = None
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("CPU:0")
        allocator = tf.config.experimental.get_memory_info("CPU:0")["current"]
    baseline, method = reset_peak_rss()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    measured = {"seconds": seconds, "peak_rss_bytes": max(0, peak_rss() - baseline), "memory_method": method,
                "rss_before_bytes": baseline}
    measured["peak_bytes"] = measured["peak_rss_bytes"]
    if allocator is not None:
        measured["peak_bytes"] = max(0, tf.config.experimental.get_memory_info("CPU:0")["peak"] - allocator)
        measured["memory_method"] = "TensorFlow CPU allocator peak (get_memory_info)"
    return measured


def choose_torch_device(requested):
    """The torch device of the run: `requested`, or for `"auto"` CUDA when
    torch sees a GPU (else the CPU). Exported as `KERAS_TORCH_DEVICE`, so
    that Keras' torch backend puts its variables and tensors there too: call
    before importing Keras. (Other backends ignore the variable.)"""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if requested == "auto":
        requested = "cuda" if cuda else "cpu"
    elif requested == "cuda" and not cuda:
        raise SystemExit("--device cuda: torch sees no CUDA device")
    os.environ["KERAS_TORCH_DEVICE"] = requested
    return requested


def device_synchronizer(backend, device):
    """A function that waits for the device's queued work: `torch.cuda.synchronize`
    for torch on CUDA; elsewhere nothing (numpy outputs wait already)."""
    if backend == "torch" and device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def device_description(backend, device):
    """The device the models run on, for the header."""
    if backend == "torch":
        import torch

        if device == "cuda":
            precision = torch.get_float32_matmul_precision()
            return f"{torch.cuda.get_device_name()} (torch cuda; float32 matmul precision '{precision}')"
        return f"cpu (torch): {cpu_model()}"
    if backend == "jax":
        import jax

        first = jax.devices()[0]
        return f"{first.platform} (jax): {first.device_kind}"
    return f"{backend}'s default device"


# Peak rates of the GPUs we benchmark on, from NVIDIA's data sheets (dense, no
# sparsity): matmul FLOP/s with bfloat16 inputs, with float32 inputs rounded to
# TF32 on the tensor cores, and in plain float32 (no TF32), and the memory (HBM)
# bandwidth in bytes/s. Keyed by a part of the device name that torch
# (`torch.cuda.get_device_name()`) and JAX (`device_kind`) report, as
# `device_description` prints it; `peak_rates` looks the key up there.
PEAK_RATES = {
    # H100 SXM
    "H100 80GB HBM3": dict(bf16=989e12, tf32=494.7e12, fp32=66.9e12, bandwidth=3.35e12),
    # H200 SXM: the H100 SXM's compute with faster HBM3e (an "H200 NVL" matches too;
    # its compute peaks are lower)
    "H200": dict(bf16=989e12, tf32=494.7e12, fp32=66.9e12, bandwidth=4.8e12),
    "H100 PCIe": dict(bf16=756e12, tf32=378e12, fp32=51.2e12, bandwidth=2.0e12),
    "A100-SXM4-80GB": dict(bf16=312e12, tf32=156e12, fp32=19.5e12, bandwidth=2.039e12),
}


def peak_rates(description):
    """The `PEAK_RATES` entry whose key occurs in `description` (a
    `device_description`), or None: CPUs, GPUs not in the table, and
    TensorFlow (whose device the description does not name)."""
    return next((rates for name, rates in PEAK_RATES.items() if name in description), None)
