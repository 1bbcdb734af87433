"""What the decoding controls cost: GPT-2-small-shaped greedy generation
with and without `repetition_penalty=1.2, no_repeat_ngram_size=3,
bad_words_ids=[[10], [20, 30]], min_new_tokens=8` (every control at once),
ours on the Keras backend of the run and `transformers` (torch, eager, its
logits processors) beside it, on the same prompts in interleaved rounds
(`benchmarks.contenders`).

Ours applies the controls inside the compiled loop (`generation.decoding_controls`:
a scatter or a comparison over `batch × length` ids per step);
`transformers` runs its processors in Python between steps. The table gives
each one's time with the controls over its time without them, then ours
against `transformers` with the controls on.

Run: `bash benchmarks/run.sh decoding_controls` (every backend, log and JSON
in `benchmarks/results/`), or `KERAS_BACKEND=jax python -m
benchmarks.decoding_controls_benchmark` (GPT-2 small, batch sizes 1 and 8,
32 new tokens); `--tiny` for a quick check.
"""

import numpy as np

from benchmarks.contenders import ratio_cells
from benchmarks.gpt_generation_benchmark import transformers_gpt2
from benchmarks.streaming_benchmark import GPT2_SMALL
from benchmarks.streaming_benchmark import TINY
from benchmarks.streaming_benchmark import build_model
from benchmarks.streaming_benchmark import parse_generation_args
from benchmarks.streaming_benchmark import time_generation
from benchmarks.timing import cpu_line
from benchmarks.timing import load_line
from benchmarks.timing import start_backend
from benchmarks.timing import write_json

CONTROLS = dict(repetition_penalty=1.2, no_repeat_ngram_size=3, bad_words_ids=[[10], [20, 30]], min_new_tokens=8)


def parse_args(argv=None):
    return parse_generation_args(argv, __doc__, new_tokens=32)


def runners_for(lm, reference, prompts, new_tokens):
    """`{name: () -> token ids}`: ours and `transformers`', each plain and
    with `CONTROLS`, generating exactly `new_tokens` tokens per row."""
    import torch

    inputs = {"token_ids": prompts, "padding_mask": np.ones_like(prompts)}
    input_ids = torch.from_numpy(prompts).long()

    def ours(**controls):
        return lambda: lm.generate(inputs, max_new_tokens=new_tokens, stop_token_ids=None, **controls)["token_ids"]

    def theirs(**controls):
        def generate():
            with torch.no_grad():
                return reference.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                    do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=None, **controls,
                ).numpy()

        return generate

    # (min_new_tokens bans the stop ids; with none, it changes nothing but still runs.)
    return {"ours": ours(), "ours + controls": ours(**CONTROLS), "transformers": theirs(),
            "transformers + controls": theirs(**CONTROLS)}


def run_batch(lm, reference, prompts, args):
    return time_generation(runners_for(lm, reference, prompts, args.new_tokens), len(prompts), args)


def main(argv=None):
    args = parse_args(argv)
    backend, _ = start_backend(args.threads)
    backend = args.backend_label or backend
    config = TINY if args.tiny else GPT2_SMALL
    lm = build_model(config, sequence_length=args.prompt_len + args.new_tokens)  # (the same weights)
    reference = transformers_gpt2({**config, "max_sequence_length": 1024}).eval()
    print(f"backend {backend}; {cpu_line(args.threads)}; {load_line('start')}")
    print(f"model {config}, prompt {args.prompt_len} tokens + {args.new_tokens} new, greedy; controls {CONTROLS}")
    print("| batch | ours (s) | ours + controls (s) | ratio median / min / paired | transformers (s) "
          "| transformers + controls (s) | ratio median / min / paired | theirs / ours, controls on |")
    print("|" + "---|" * 8)
    results = {}
    for batch_size in args.batch_sizes:
        prompts = np.random.default_rng(batch_size).integers(100, config["vocabulary_size"] - 1,
                                                             size=(batch_size, args.prompt_len)).astype("int32")
        entries = run_batch(lm, reference, prompts, args)
        results[batch_size] = entries
        ours, ours_controls = entries["ours"], entries["ours + controls"]
        theirs, theirs_controls = entries["transformers"], entries["transformers + controls"]
        ours_ratio = " / ".join(ratio_cells(ours_controls, ours))
        their_ratio = " / ".join(ratio_cells(theirs_controls, theirs))
        versus = ratio_cells(dict(theirs_controls), ours_controls)[2]
        print(f"| {batch_size} | {ours['median_s']:.3f} | {ours_controls['median_s']:.3f} | {ours_ratio} "
              f"| {theirs['median_s']:.3f} | {theirs_controls['median_s']:.3f} | {their_ratio} | {versus} |")
    print("\nratios: time with the controls / without (above 1: what they cost), of the medians, of the minima and"
          "\npaired (the median over rounds of the per-round ratio, which cancels load that changes between rounds);"
          "\nlast column: transformers / ours with the controls on, paired (above 1: ours faster).")
    print(load_line("end"))
    if args.json:
        write_json(args.json, {"backend": backend, "config": config, "controls": CONTROLS, "args": vars(args),
                               "results": results})


if __name__ == "__main__":
    main()
