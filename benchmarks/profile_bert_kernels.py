"""Which CUDA kernels a BERT-base forward runs, ours against transformers
(torch backend, one GPU): the `torch.profiler` table of the kernels by total
time for one forward of each, on the inputs of `bert_benchmark.py` (padded
rows), so that a difference in time can be put on the kernels that make it.
With `--jit-compile`, ours is `predict_on_batch`'s step after
`compile(jit_compile=True)` (inductor, replayed as a CUDA graph) and
`transformers`' forward is `torch.compile`d; each contender's wall time for
the profiled call is printed beside its kernel time.

    KERAS_BACKEND=torch python -m benchmarks.profile_bert_kernels --seq-len 512 --dtype bfloat16
"""

import argparse
import time

from benchmarks.bert_benchmark import BERT_BASE
from benchmarks.bert_benchmark import keras_step
from benchmarks.bert_benchmark import make_inputs
from benchmarks.bert_benchmark import transformers_bert
from benchmarks.bert_benchmark import transformers_inputs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rows", type=int, default=12, help="kernels listed per contender")
    parser.add_argument("--jit-compile", action="store_true", help="both compiled (see the module docstring)")
    args = parser.parse_args()

    import torch

    from attention_zoo_keras.models import BertBackbone

    inputs = make_inputs(args.batch_size, args.seq_len, BERT_BASE["vocabulary_size"], no_padding=False)
    ours = BertBackbone(**BERT_BASE, dtype=args.dtype)
    ours_inputs = {name: torch.as_tensor(value, device="cuda") for name, value in inputs.items()}
    theirs = transformers_bert(BERT_BASE).to("cuda", getattr(torch, args.dtype)).eval()
    their_inputs = transformers_inputs(inputs, "cuda")
    if args.jit_compile:
        ours_forward, _ = keras_step(ours, "inference", ours_inputs, None, "true", "sgd", "device")
        theirs.forward = torch.compile(theirs.forward)
        contenders = {
            "ours (predict_on_batch's step, jit_compile=True)": ours_forward,
            "transformers + torch.compile": lambda: theirs(**their_inputs),
        }
    else:
        contenders = {
            "ours (eager Keras call: the kernels its recorded replay runs)": lambda: ours(ours_inputs, training=False),
            "transformers": lambda: theirs(**their_inputs),
        }
    for name, forward in contenders.items():
        with torch.no_grad():
            for _ in range(3):
                forward()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                start = time.perf_counter()
                forward()
                torch.cuda.synchronize()
                wall = time.perf_counter() - start
        events = [e for e in profile.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in events)
        print(
            f"\n## {name}: {sum(e.count for e in events)} kernel launches, {total / 1e3:.2f} ms of kernel time,"
            f" {wall * 1e3:.2f} ms wall (profiled)"
        )
        for event in sorted(events, key=lambda e: -e.self_device_time_total)[: args.rows]:
            print(f"{event.self_device_time_total / 1e3:8.3f} ms  {event.count:5d}x  {event.key[:110]}")


if __name__ == "__main__":
    main()
