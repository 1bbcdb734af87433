"""Fine-tune GPT-2 with LoRA on a small corpus, save the adapter, merge it.

LoRA (Hu et al., 2021) freezes the pretrained weights and learns a low-rank
update `(α/r) A B` of the chosen projections: here the attention query and
value and the feed-forward layers of every block, rank 8, about 1% of
GPT-2's 124M parameters. The script:

1. loads `GPTCausalLM.from_preset(--preset)` (GPT-2 small from the Hub by
   default; any GPT preset or local directory works);
2. measures the corpus' perplexity, enables LoRA and fine-tunes on it;
3. measures again and continues a prompt;
4. saves the adapted model as a preset (the base weights, the LoRA matrices
   and the settings: `from_preset` rebuilds it as it was), and the merged
   model (`merge_lora()`: plain weights, the base model's speed).

Run: `KERAS_BACKEND=jax python examples/gpt_lora/train.py --output ./gpt2_lora`
(`--help` for the options). Nothing but the preset is downloaded.
"""

import argparse
import math

import keras

import attention_zoo_keras as azk

# A small corpus in one style: short sayings about attention and learning.
CORPUS = [
    "Attention is what a model pays to the words that matter.",
    "A query asks, a key answers, and a value is what is passed on.",
    "Every head of attention looks at the sentence in its own way.",
    "The softmax turns scores into weights that sum to one.",
    "Layer normalization keeps the activations in a steady range.",
    "A residual connection lets the signal skip what it does not need.",
    "Positions are added to the words so that order is not lost.",
    "The decoder writes one token at a time and never looks ahead.",
    "The encoder reads the whole sentence at once, in both directions.",
    "A small learning rate and patience make training stable.",
    "Dropout forgets a little at random so that nothing is learned by heart.",
    "The feed-forward layer widens each position and narrows it again.",
    "A cache of keys and values makes generation fast.",
    "Low-rank updates change a large model with very few numbers.",
    "Pretraining teaches language; fine-tuning teaches the task.",
    "Beam search keeps several guesses and chooses the best at the end.",
]
TARGET_NAMES = ("query", "value", "intermediate", "output")


def perplexity(lm, texts, batch_size=8):
    """`exp` of the mean per-token cross-entropy of `texts` under `lm`."""
    lm.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[], weighted_metrics=[])
    return math.exp(lm.evaluate(texts, batch_size=batch_size, verbose=0))


def fine_tune(lm, texts, rank=8, epochs=8, learning_rate=2e-3, batch_size=8, verbose=1):
    """Enables LoRA of `rank` on `lm`'s `TARGET_NAMES` layers and trains the
    LoRA matrices alone on `texts`; returns Keras' history."""
    lm.enable_lora(rank, target_names=TARGET_NAMES)
    lm.compile(
        optimizer=azk.optimizers.FusedAdamW(learning_rate, weight_decay=0.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[], weighted_metrics=[],
    )
    return lm.fit(texts, batch_size=batch_size, epochs=epochs, verbose=verbose)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt2", help="a GPT preset name, hf:// handle or directory")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--prompt", default="A query asks,")
    parser.add_argument("--output", default="./gpt2_lora", help="where the LoRA preset goes ('_merged' for the merged one)")
    arguments = parser.parse_args(argv)

    lm = azk.models.GPTCausalLM.from_preset(arguments.preset)
    total = lm.count_params()
    before = perplexity(lm, CORPUS)
    history = fine_tune(lm, CORPUS, arguments.rank, arguments.epochs, arguments.learning_rate)
    trainable = sum(math.prod(variable.shape) for variable in lm.trainable_weights)
    after = perplexity(lm, CORPUS)
    print(f"LoRA rank {arguments.rank}: {trainable:,} trainable of {total:,} parameters ({trainable / total:.2%}).")
    print(f"Corpus perplexity: {before:.1f} before, {after:.1f} after fine-tuning.")
    print("Continuation:", lm.generate(arguments.prompt, max_new_tokens=16))

    lm.save_to_preset(arguments.output)
    merged = lm.merge_lora()
    merged.save_to_preset(arguments.output + "_merged")
    print(f"Saved the LoRA model to {arguments.output} and the merged one to {arguments.output}_merged.")
    return {"before": before, "after": after, "history": history.history, "trainable": trainable, "total": total}


if __name__ == "__main__":
    main()
