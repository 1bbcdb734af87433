"""Fixtures of the Transformer family's tests: the tokenizer files of a tiny
Marian MT checkpoint."""

import io
import json
import random

import pytest

# English-like source and German/Greek target sentences: the target has
# characters (ß, ü, Greek) the source model has never seen, so the shared
# vocabulary holds pieces one side's model cannot produce.
SOURCE_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "A small frog sat on a green leaf near the river.",
    "Translation models learn to map sentences from one language to another.",
    "Numbers like 42, 3.14 and 1,000 appear in text too.",
    'She said: "Hello, world!" and left the room.',
    "Attention is all you need, they wrote in 2017.",
    "Café, naïve and résumé keep their accents.",
    "Write x < y and y > z in <b>bold</b> (see the manual).",
    "We train the model for ten epochs on the corpus.",
    "Where is the train station? It is near the old bridge.",
)
TARGET_CORPUS = (
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Ein kleiner Frosch saß auf einem grünen Blatt am Fluss.",
    "Übersetzungsmodelle lernen, Sätze von einer Sprache in eine andere zu übertragen.",
    "Zahlen wie 42, 3,14 und 1.000 kommen auch im Text vor.",
    "Sie sagte: „Hallo, Welt!“ und verließ den Raum.",
    "Aufmerksamkeit ist alles, was man braucht, schrieben sie 2017.",
    "Straße, Größe und Maß schreibt man mit ß.",
    "Schreibe x < y und y > z in <b>fett</b> (siehe Handbuch).",
    "Το γρήγορο καφέ αλεπού πηδά πάνω από τον σκύλο.",
    "Wo ist der Bahnhof? Er ist nahe der alten Brücke.",
)
LANGUAGE_CODES = (">>de<<", ">>el<<")


def _unigram_model(corpus, vocab_size):
    """The bytes of a SentencePiece unigram model trained on `corpus`."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus * 3),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        normalization_rule_name="nmt_nfkc",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def _normal_pieces(model_file):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    return [
        processor.id_to_piece(index)
        for index in range(processor.get_piece_size())
        if not (processor.is_control(index) or processor.is_unknown(index) or processor.is_unused(index))
    ]


@pytest.fixture(scope="session")
def tiny_marian_tokenizer_files(tmp_path_factory):
    """A directory with a Marian hub repo's tokenizer files: `source.spm`,
    `target.spm`, `vocab.json` and `tokenizer_config.json`.

    Two SentencePiece unigram models (source 100 pieces, target 110) share
    `vocab.json`, laid out as OPUS-MT's are: `</s>` = 0, `<unk>` = 1, the
    language codes, the union of both models' pieces in shuffled order, and
    `<pad>` last. One source piece is left out of the vocabulary, so it
    becomes `<unk>`.
    """
    directory = tmp_path_factory.mktemp("tiny_marian")
    (directory / "source.spm").write_bytes(_unigram_model(SOURCE_CORPUS, 100))
    (directory / "target.spm").write_bytes(_unigram_model(TARGET_CORPUS, 110))
    source_pieces = _normal_pieces(directory / "source.spm")
    target_pieces = [piece for piece in _normal_pieces(directory / "target.spm") if piece not in source_pieces]
    left_out = source_pieces.pop(len(source_pieces) // 2)
    pieces = source_pieces + target_pieces
    random.Random(0).shuffle(pieces)
    vocabulary = {"</s>": 0, "<unk>": 1}
    for token in (*LANGUAGE_CODES, *pieces, "<pad>"):
        vocabulary[token] = len(vocabulary)
    assert left_out not in vocabulary
    (directory / "vocab.json").write_text(json.dumps(vocabulary, ensure_ascii=False, indent=2), encoding="utf-8")
    config = {"source_lang": "en", "target_lang": "de", "model_max_length": 512, "separate_vocabs": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


TINY_MARIAN = dict(
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=64,
    activation_function="swish",
    scale_embedding=True,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    eos_token_id=0,
    forced_eos_token_id=0,
    init_std=0.3,
)


@pytest.fixture(scope="session")
def tiny_marian_checkpoint(tmp_path_factory, tiny_marian_tokenizer_files):
    """A random-weight tiny `transformers` `MarianMTModel` saved with the
    tokenizer files of `tiny_marian_tokenizer_files`: a Marian hub repo.

    Weights are drawn with a large `init_std` and every trainable parameter (and the
    logits bias) is then moved by 0.1·N(0, 1), so that no bias is 0, no norm
    is the identity, and the decoding of random weights does not settle on
    one repeated token at once.
    """
    import shutil

    import torch
    import transformers

    vocabulary = json.loads((tiny_marian_tokenizer_files / "vocab.json").read_text(encoding="utf-8"))
    pad = vocabulary["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocabulary), pad_token_id=pad, decoder_start_token_id=pad, **TINY_MARIAN
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:  # not the frozen sinusoid tables, which are not weights
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
        model.final_logits_bias.add_(0.1 * torch.randn(model.final_logits_bias.shape, generator=generator))
    directory = tmp_path_factory.mktemp("tiny_marian_model")
    model.save_pretrained(directory)
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(tiny_marian_tokenizer_files / name, directory / name)
    return directory
