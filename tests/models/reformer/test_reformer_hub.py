"""The named Reformer presets end to end on the local hub: tiny random
`transformers` checkpoints laid out as the two Google repos are (the
crime-and-punishment one with its SentencePiece `spiece.model`, the enwik8
one with no tokenizer files: byte ids) published where the presets point,
loaded by name, generating text and saved as native presets."""


import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub import PresetFileError
from attention_zoo_keras.models.reformer import ReformerByteTokenizer
from attention_zoo_keras.models.reformer import ReformerCausalLM
from attention_zoo_keras.models.reformer import ReformerTokenizer
from tests.support.tiny_checkpoints import perturbed
from tests.support.reformer_sentencepiece import train_sentencepiece

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

from attention_zoo_keras.conversion import cli  # noqa: E402
from attention_zoo_keras.conversion import state_dict  # noqa: E402
from attention_zoo_keras.conversion import verifiers  # noqa: E402

TINY = dict(
    hidden_size=16, num_attention_heads=2, attention_head_size=8, feed_forward_size=32, lsh_attn_chunk_length=4,
    local_attn_chunk_length=4, axial_pos_shape=[8, 8], axial_pos_embds_dim=[8, 8], max_position_embeddings=64,
    is_decoder=True, pad_token_id=0, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
)
PROMPT = "He walked slowly towards the bridge"


def _publish(local_hub, repo, directory, **config):
    model = transformers.ReformerModelWithLMHead(transformers.ReformerConfig(**TINY, **config))
    perturbed(model, 1).save_pretrained(directory)
    local_hub.add_repo(repo, directory)


@pytest.mark.slow
def test_crime_and_punishment_preset_loads_its_sentencepiece_vocabulary(local_hub, tmp_path):
    directory = tmp_path / "crime"
    spiece = train_sentencepiece(directory, "bpe")
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spiece))
    _publish(
        local_hub, "google/reformer-crime-and-punishment", directory, vocab_size=processor.get_piece_size(),
        attn_layers=["local", "lsh"], num_buckets=[2, 4], eos_token_id=2,
    )
    lm = ReformerCausalLM.from_preset("reformer_crime_and_punishment")
    tokenizer = lm.preprocessor.tokenizer
    assert isinstance(tokenizer, ReformerTokenizer)
    assert tokenizer.encode([PROMPT]) == [processor.encode(PROMPT)]
    text = lm.generate(PROMPT, max_new_tokens=10, stop_token_ids=None)
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)

    lm.save_to_preset(tmp_path / "native")
    native = ReformerCausalLM.from_preset(str(tmp_path / "native"))
    assert isinstance(native.preprocessor.tokenizer, ReformerTokenizer)
    ids = np.array(tokenizer.encode([PROMPT]))
    features = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    # Generation hashes with fixed rotations (no hash_seed: the decoding default), so both agree.
    np.testing.assert_array_equal(
        native.generate(features, max_new_tokens=8, stop_token_ids=None)["token_ids"],
        lm.generate(features, max_new_tokens=8, stop_token_ids=None)["token_ids"],
    )


@pytest.mark.slow
def test_enwik8_preset_reads_bytes(local_hub, tmp_path):
    _publish(
        local_hub, "google/reformer-enwik8", tmp_path / "enwik8", vocab_size=258, attn_layers=["lsh", "lsh"],
        num_hashes=2, num_buckets=4, eos_token_id=1,
    )
    lm = ReformerCausalLM.from_preset("reformer_enwik8")
    tokenizer = lm.preprocessor.tokenizer
    assert isinstance(tokenizer, ReformerByteTokenizer)
    assert tokenizer.encode(["né"]) == [[ord("n") + 2, 0xC3 + 2, 0xA9 + 2]]
    generated = lm.generate("né", max_new_tokens=12, stop_token_ids=None)
    assert generated.startswith("né")
    lm.save_to_preset(tmp_path / "native")
    assert isinstance(ReformerCausalLM.from_preset(str(tmp_path / "native")).preprocessor.tokenizer, ReformerByteTokenizer)


def test_conversion_reads_a_bin_checkpoint_verifies_and_writes_a_native_preset(tmp_path):
    source = tmp_path / "bin_checkpoint"
    config = transformers.ReformerConfig(
        **TINY, vocab_size=258, attn_layers=["local", "lsh"], num_hashes=2, num_buckets=[2, 2], eos_token_id=1
    )
    model = perturbed(transformers.ReformerModelWithLMHead(config), 2)  # lm_head.bias nonzero too
    model.save_pretrained(source)
    (source / "model.safetensors").unlink()
    torch.save(model.state_dict(), source / "pytorch_model.bin")
    with pytest.raises(PresetFileError, match="never unpickled at run time"):
        ReformerCausalLM.from_preset(str(source))

    assert cli.main([str(a) for a in ("convert", source, "--class", "ReformerCausalLM", "--out", tmp_path / "native")]) == 0
    native = ReformerCausalLM.from_preset(str(tmp_path / "native"))
    # The bias transformers adds: the decoder's from 5.24 on, else `lm_head.bias`.
    bias = model.lm_head.decoder.bias if model.lm_head.decoder.bias is not None else model.lm_head.bias
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(native.lm_head.bias), bias.detach().numpy())
    assert isinstance(native.preprocessor.tokenizer, ReformerByteTokenizer)


def test_conversion_saves_nothing_when_verification_fails(tmp_path, monkeypatch):
    source = tmp_path / "checkpoint"
    config = transformers.ReformerConfig(**TINY, vocab_size=258, attn_layers=["lsh"], num_buckets=4, eos_token_id=1)
    perturbed(transformers.ReformerModelWithLMHead(config), 3).save_pretrained(source)
    source_handle = azk.hub.PresetSource(str(source))
    model = state_dict.convert(ReformerCausalLM, str(source))
    assert verifiers.verify_reformer(model, source_handle, 8)["max_abs_difference"]["logits"] < verifiers.TOLERANCE
    kernel = model.backbone.feed_forward_branches[0].feed_forward.output_dense.kernel
    kernel.assign(keras.ops.convert_to_numpy(kernel) + 0.01)
    assert verifiers.verify_reformer(model, source_handle, 8)["max_abs_difference"]["logits"] > verifiers.TOLERANCE

    monkeypatch.setattr(state_dict, "convert", lambda model_cls, src: model)  # the perturbed one
    arguments = ("convert", source, "--class", "ReformerCausalLM", "--out", tmp_path / "native")
    assert cli.main([str(a) for a in arguments]) == 1
    assert not (tmp_path / "native").exists()
