"""What streaming `generate` costs: GPT-2-small-shaped greedy generation
from text prompts, whole (`generate(texts)`) against streamed
(`list(generate(texts, stream=True))`), on the Keras backend of the run.

Both contenders run the same model on the same prompts in interleaved
rounds (`benchmarks.contenders`); the streamed one also records the time to
its first generated text (the first piece after the prompt's). Streaming
runs the decoding loop in chunks of 1, 2, 4, 8, then 16 tokens
(`generation.streaming`), one compiled program called per chunk, and reads
the buffer back after each; the target is at most 10 % of the throughput.

The tokenizer is byte-level BPE over the 256 byte symbols, `<|endoftext|>`
and filler tokens up to GPT-2's 50,257 ids, without merges: prompts encode
to one token per byte, and every generated id decodes to text, so the
streamed run decodes and cuts text as it would with GPT-2's own tokenizer.

Run: `bash benchmarks/run.sh streaming` (every backend, log and JSON in
`benchmarks/results/`), or `KERAS_BACKEND=jax python -m
benchmarks.streaming_benchmark` (GPT-2 small, batch sizes 1 and 8, 64 new
tokens); `--tiny` for a quick check.
"""

import argparse
import os
import time

from benchmarks.contenders import RATIO_NOTE
from benchmarks.contenders import ratio_cells
from benchmarks.contenders import time_rounds
from benchmarks.timing import cpu_line
from benchmarks.timing import load_line
from benchmarks.timing import start_backend
from benchmarks.timing import write_json

GPT2_SMALL = dict(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072)
TINY = dict(vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128)


def parse_args(argv=None):
    return parse_generation_args(argv, __doc__, new_tokens=64, prompt_help="prompt bytes (= tokens)")


def parse_generation_args(argv, doc, new_tokens, prompt_help=None):
    """The arguments of a GPT-2 generation benchmark (this one, the
    decoding controls'), described by the first paragraph of `doc`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32, help=prompt_help)
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per batch size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls of each contender first")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of the backend (default: all)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model: a smoke test of the script")
    parser.add_argument("--backend-label", default=None, help="the backend's name in the output (default: Keras')")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    return parser.parse_args(argv)


def byte_tokenizer(vocabulary_size):
    """A byte-level BPE `GPTTokenizer` of `vocabulary_size` ids: the 256
    byte symbols, `<|endoftext|>`, then filler tokens; no merges."""
    from tokenizers import pre_tokenizers

    from attention_zoo_keras.models.gpt import GPTTokenizer
    from attention_zoo_keras.models.gpt.gpt_tokenizer import END_TOKEN

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocabulary = {symbol: index for index, symbol in enumerate(symbols)}
    vocabulary[END_TOKEN] = len(vocabulary)
    for index in range(len(vocabulary), vocabulary_size):
        vocabulary[f"x{index}"] = index
    return GPTTokenizer.from_vocabulary(vocabulary, [])


def build_model(config, sequence_length):
    import numpy as np

    from attention_zoo_keras.models import GPTBackbone
    from attention_zoo_keras.models import GPTCausalLM
    from attention_zoo_keras.models import GPTCausalLMPreprocessor

    backbone = GPTBackbone(**config, max_sequence_length=1024, dropout=0.0, attention_dropout=0.0)
    rng = np.random.default_rng(0)
    for variable in backbone.weights:  # large enough that greedy decoding does not repeat one token
        variable.assign(rng.normal(0.0, 0.2, variable.shape).astype(variable.dtype))
    preprocessor = GPTCausalLMPreprocessor(byte_tokenizer(config["vocabulary_size"]), sequence_length=sequence_length)
    return GPTCausalLM(backbone, preprocessor)


def prompts(batch_size, length):
    import numpy as np

    rng = np.random.default_rng(batch_size)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    return ["".join(rng.choice(letters, size=length)) for _ in range(batch_size)]


def run_batch(lm, texts, args):
    """Times both contenders on `texts`; returns `{name: entry}`."""
    arguments = {"max_new_tokens": args.new_tokens, "stop_token_ids": None}
    whole = lm.generate(texts, **arguments)
    first_piece_s = []

    def streamed():
        start, pieces = time.perf_counter(), []
        for piece in lm.generate(texts, stream=True, **arguments):
            pieces.append(piece)
            if len(pieces) == 2:
                first_piece_s.append(time.perf_counter() - start)
        return pieces

    joined = ["".join(piece[row] for piece in streamed()) for row in range(len(texts))]
    if joined != whole:
        raise SystemExit("the streamed pieces do not join to generate's output")
    runners = {"whole": lambda: lm.generate(texts, **arguments), "streamed": streamed}
    entries = time_generation(runners, len(texts), args, before_rounds=first_piece_s.clear)
    entries["streamed"]["first_piece_median_s"] = sorted(first_piece_s)[len(first_piece_s) // 2]
    return entries


def time_generation(runners, batch_size, args, before_rounds=lambda: None):
    """Calls each runner `args.warmup` times, then `before_rounds()`, then
    times them in `args.repeats` rounds (`time_rounds`); each entry also
    gets the new tokens per second of its median."""
    for call in runners.values():
        for _ in range(args.warmup):
            call()
    before_rounds()
    entries = time_rounds(runners, args.repeats)
    for entry in entries.values():
        entry["tokens_per_s"] = batch_size * args.new_tokens / entry["median_s"]
    return entries


def main(argv=None):
    args = parse_args(argv)
    backend, _ = start_backend(args.threads)
    backend = args.backend_label or backend
    config = TINY if args.tiny else GPT2_SMALL
    lm = build_model(config, sequence_length=args.prompt_len + args.new_tokens)
    print(f"backend {backend}; {cpu_line(args.threads)}; {load_line('start')}")
    print(f"model {config}, prompt {args.prompt_len} tokens + {args.new_tokens} new, greedy")
    results = {}
    header = "| batch | whole (s) | streamed (s) | tokens/s whole | tokens/s streamed | first piece (s) | ratio median / min / paired |"
    rows = []
    for batch_size in args.batch_sizes:
        entries = run_batch(lm, prompts(batch_size, args.prompt_len), args)
        results[batch_size] = entries
        whole, streamed = entries["whole"], entries["streamed"]
        ratios = " / ".join(ratio_cells(streamed, whole))
        rows.append(
            f"| {batch_size} | {whole['median_s']:.3f} | {streamed['median_s']:.3f} | {whole['tokens_per_s']:.1f} "
            f"| {streamed['tokens_per_s']:.1f} | {streamed['first_piece_median_s']:.3f} | {ratios} |"
        )
    print(header)
    print("|" + "---|" * 7)
    print("\n".join(rows))
    print(RATIO_NOTE.replace("ours", "whole") + ").")
    print(load_line("end"))
    if args.json:
        write_json(args.json, {"backend": backend, "config": config, "args": vars(args), "results": results})


if __name__ == "__main__":
    main()
