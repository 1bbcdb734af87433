"""The `transformer_xl_wt103` preset end to end on the local hub (the
fixture checkpoint published where the preset points, with a vocabulary
pickle written the way `transformers` 4.37 writes it), `azk-convert
convert` of a `.bin` checkpoint, and refusal of vocabulary pickles that name
anything but plain data."""

import collections
import os
import pickle
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import attention_zoo_keras as azk
from attention_zoo_keras.conversion import cli
from attention_zoo_keras.hub import PresetFileError
from attention_zoo_keras.models.transformer_xl import TransformerXLCausalLM


FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "transfo_xl"
WT103_REPO = "transfo-xl/transfo-xl-wt103"  # where presets/transformer_xl_wt103.json points
WORDS = ("the of and in to a was is for on as by with he at from his an were are which it also this that "
         "history new york city war first film season game team world time two years three after").split()
TEXT = "The history of New York City , in the first years after the war ."


def _symbols(vocabulary_size=100):
    symbols = ["<eos>", "<unk>", "<formula>", ",", ".", "@-@", "@,@", "The", "New", "York", "City"] + WORDS
    return symbols + [f"word{i}" for i in range(vocabulary_size - len(symbols))]


def _write_vocabulary(path, symbols):
    """A vocabulary pickle as `TransfoXLTokenizer.save_vocabulary` wrote
    it: the tokenizer's attributes, with a Counter and an OrderedDict."""
    state = {
        "special": ["<eos>"], "min_freq": 0, "max_size": None, "lower_case": False, "delimiter": None,
        "vocab_file": None, "never_split": ["<unk>", "<eos>", "<formula>"],
        "counter": collections.Counter({symbol: len(symbols) - i for i, symbol in enumerate(symbols)}),
        "idx2sym": list(symbols), "sym2idx": collections.OrderedDict((s, i) for i, s in enumerate(symbols)),
        "unk_idx": 1,
    }
    with open(path, "wb") as file:
        pickle.dump(state, file, protocol=2)


@pytest.fixture
def wt103_checkpoint(tmp_path):
    directory = tmp_path / "transfo-xl-wt103"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, directory / name)
    _write_vocabulary(directory / "vocab.pkl", _symbols())
    return directory


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def test_named_preset_loads_from_the_hub_and_runs(local_hub, wt103_checkpoint):
    assert azk.list_presets()["transformer_xl_wt103"]["source"] == f"hf://{WT103_REPO}"
    local_hub.add_repo(WT103_REPO, wt103_checkpoint)
    lm = TransformerXLCausalLM.from_preset("transformer_xl_wt103")
    tokenizer = lm.preprocessor.tokenizer
    assert tokenizer.vocabulary_size == 100 and tokenizer.end_token_id == 0
    assert lm.preprocessor.sequence_length == 5  # tgt_len
    # The same numbers as the checkpoint loaded from disk (whose parity with
    # transformers test_transformer_xl_parity checks).
    ids = np.array([tokenizer.encode([TEXT])[0][:5]])
    from_disk = TransformerXLCausalLM.from_preset(str(FIXTURE), preprocessor=None)
    np.testing.assert_allclose(
        _numpy(lm.score(ids)["log_probabilities"]), _numpy(from_disk.score(ids)["log_probabilities"]), atol=1e-6
    )
    text = lm.generate("The history of", max_new_tokens=6, stop_token_ids=None)
    assert text.startswith("The history of") and len(text.split()) >= 4
    results = lm.evaluate([TEXT, TEXT], batch_size=2, verbose=0, return_dict=True)
    assert np.isfinite(results["perplexity"]) and results["perplexity"] > 1
    lm.fit([TEXT] * 4, batch_size=2, epochs=1, verbose=0)


def test_a_vocabulary_pickle_naming_a_non_container_class_is_refused(tmp_path, wt103_checkpoint):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(wt103_checkpoint / "vocab.pkl", "wb") as file:
        pickle.dump({"idx2sym": _symbols(), "payload": Exploit()}, file)
    with pytest.raises(PresetFileError, match="system"):
        TransformerXLCausalLM.from_preset(str(wt103_checkpoint))
    assert not marker.exists()


def test_conversion_reads_a_bin_checkpoint_and_writes_a_native_preset(tmp_path, wt103_checkpoint, capsys):
    source = tmp_path / "bin_checkpoint"
    shutil.copytree(wt103_checkpoint, source)
    (source / "model.safetensors").unlink()
    tensors = {name: torch.from_numpy(array) for name, array in load_file(str(FIXTURE / "model.safetensors")).items()}
    torch.save(tensors, source / "pytorch_model.bin")  # tied tensors stored once, as save_pretrained does
    destination = tmp_path / "native"
    arguments = ("convert", source, "--class", "TransformerXLCausalLM", "--out", destination)
    assert cli.main([str(a) for a in arguments]) == 0
    assert "not verified: transformers removed Transformer-XL" in capsys.readouterr().out
    assert (destination / "tokenizer.json").is_file() and (destination / "model.safetensors").is_file()

    converted = TransformerXLCausalLM.from_preset(str(destination))
    reference = TransformerXLCausalLM.from_preset(str(FIXTURE), preprocessor=None)
    ids = np.array([[7, 8, 9, 10, 3]], "int32")
    np.testing.assert_allclose(
        _numpy(converted.score(ids)["log_probabilities"]), _numpy(reference.score(ids)["log_probabilities"]), atol=1e-6
    )
    assert converted.preprocessor.tokenizer.encode([TEXT]) == TransformerXLCausalLM.from_preset(
        str(wt103_checkpoint)
    ).preprocessor.tokenizer.encode([TEXT])
