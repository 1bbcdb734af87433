"""The LoRA example (`examples/gpt_lora/train.py`) on a tiny GPT preset built
here (GPT-2 itself needs the network): the corpus' perplexity falls, only
the LoRA matrices change, the saved LoRA preset rebuilds the fine-tuned
model exactly, and the merged preset gives its outputs without LoRA."""

import keras
import numpy as np
import pytest
import tokenizers

import attention_zoo_keras as azk
from tests.support.examples import load_example
from tests.support.tiny_models import weights_of


def _tiny_gpt_preset(directory, corpus):
    """A random 2-layer GPT with a byte-level BPE trained on `corpus`. LoRA
    leaves the tied embedding and the layer norms frozen, so the logits can
    only be as peaked as the embedding rows are long: they are drawn wider
    than GPT-2's initialization, closer to a trained model's."""
    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator(corpus, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"],
                                show_progress=False)
    trainer.save(str(directory / "trained_tokenizer.json"))
    tokenizer = azk.models.GPTTokenizer.from_file(directory / "trained_tokenizer.json")
    keras.utils.set_random_seed(0)
    backbone = azk.models.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64,
        max_sequence_length=32, initializer_range=0.3,  # embeddings as far apart as a pretrained model's
    )
    preprocessor = azk.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=32)
    azk.models.GPTCausalLM(backbone, preprocessor=preprocessor).save_to_preset(directory / "base")
    return directory / "base"


@pytest.mark.slow
def test_lora_fine_tuning_lowers_perplexity_and_saves_the_adapted_and_merged_model(tmp_path):
    example = load_example("gpt_lora/train.py")
    base = _tiny_gpt_preset(tmp_path, example.CORPUS)
    output = tmp_path / "lora"

    result = example.main([
        "--preset", str(base), "--rank", "4", "--epochs", "20", "--learning-rate", "1e-2", "--output", str(output),
    ])

    assert result["after"] < 0.5 * result["before"], result
    assert result["trainable"] < 0.2 * result["total"]
    base_weights = weights_of(azk.models.GPTCausalLM.from_preset(base))
    adapted = azk.models.GPTCausalLM.from_preset(output)
    adapted_weights = weights_of(adapted)
    lora_keys = sorted(key for key in adapted_weights if key not in base_weights)
    assert lora_keys and all("/lora_kernel_" in key or "/lora_embeddings_" in key for key in lora_keys)
    for key, value in base_weights.items():  # the pretrained weights did not move
        np.testing.assert_array_equal(adapted_weights[key], value, err_msg=key)

    merged = azk.models.GPTCausalLM.from_preset(f"{output}_merged")
    assert sorted(weights_of(merged)) == sorted(base_weights)
    texts = example.CORPUS[:3]
    np.testing.assert_allclose(merged.predict(texts, verbose=0), adapted.predict(texts, verbose=0), atol=1e-4)
    assert abs(example.perplexity(adapted, example.CORPUS) - result["after"]) < 1e-3 * result["after"]
