"""Whether GPT-2 small's greedy `generate` is bound by the host or by the GPU
(torch backend, one CUDA GPU): for each contender and batch size, one call's
wall time per new token against the GPU's kernel time per new token (from
`torch.profiler`), the kernels and CUDA-graph launches per token, and the
time the host spent waiting for the device. Kernel time far below wall time
means the GPU idles while the host works; kernel time close to it means
fewer or faster kernels are what would help. Same models, prompts and
calls as `gpt_generation_benchmark.py`.

    KERAS_BACKEND=torch python -m benchmarks.profile_gpt_decoding --batch-sizes 1 8 --dtype bfloat16
"""

import argparse
import sys
import time

from benchmarks.gpt_generation_benchmark import GPT2_SMALL
from benchmarks.gpt_generation_benchmark import build_ours
from benchmarks.gpt_generation_benchmark import build_transformers
from benchmarks.gpt_generation_benchmark import make_prompts

# CUDA runtime calls in which the host waits for the device.
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync")


def build(name, args):
    """`(prepare, generate)` of contender `name`."""
    if name.startswith("transformers"):
        _, prepare, generate, _, _ = build_transformers(
            GPT2_SMALL, args.prompt_len, args.new_tokens, args.dtype, "cuda", name == "transformers_static"
        )
    else:
        _, prepare, generate, _, _ = build_ours(GPT2_SMALL, args.new_tokens, args.dtype, name == "ours_compiled")
    return prepare, generate


def profile_call(generate, inputs, new_tokens, rows):
    """One profiled call's numbers per new token (µs) and its top kernels."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as profile:
        start = time.perf_counter()
        generate(inputs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = profile.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    runtime = {e.key: e for e in events if e.device_type == torch.autograd.DeviceType.CPU}
    per_token = 1e6 / new_tokens
    numbers = {
        "wall_us": wall * per_token,
        "kernel_us": sum(e.self_device_time_total for e in kernels) / 1e6 * per_token,
        "kernels": sum(e.count for e in kernels) / new_tokens,
        "graph_launches": runtime["cudaGraphLaunch"].count / new_tokens if "cudaGraphLaunch" in runtime else 0.0,
        "host_wait_us": sum(runtime[k].self_cpu_time_total for k in HOST_WAITS if k in runtime) / 1e6 * per_token,
    }
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:rows]
    return numbers, [(e.self_device_time_total / new_tokens, e.count / new_tokens, e.key[:100]) for e in top]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--contenders", default="ours,ours_compiled,transformers_static")
    parser.add_argument("--rows", type=int, default=8, help="kernels listed per contender and batch")
    args = parser.parse_args()

    import keras
    import torch

    print(f"# GPT-2 small greedy decoding profile, {args.dtype}, {torch.cuda.get_device_name()}")
    print("per new token: wall µs | kernel µs | kernels | graph launches | host waiting µs")
    for name in args.contenders.split(","):
        keras.utils.set_random_seed(0)
        prepare, generate = build(name, args)
        for batch_size in args.batch_sizes:
            inputs = prepare(make_prompts(batch_size, args.prompt_len, GPT2_SMALL["vocabulary_size"]))
            for _ in range(3):
                generate(inputs)
            numbers, top = profile_call(generate, inputs, args.new_tokens, args.rows)
            print(
                f"\n## {name}, batch {batch_size}: wall {numbers['wall_us']:.0f} | kernels {numbers['kernel_us']:.0f}"
                f" ({numbers['kernel_us'] / numbers['wall_us']:.0%} busy) | {numbers['kernels']:.0f} kernels"
                f" | {numbers['graph_launches']:.2f} graph launches | host waiting {numbers['host_wait_us']:.0f}"
            )
            for device_us, count, kernel in top:
                print(f"{device_us:8.1f} µs {count:6.1f}x  {kernel}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
