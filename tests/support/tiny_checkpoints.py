"""Tiny random-weight `transformers` checkpoints saved to disk, and what they
are built from: `perturbed`, the configurations (`TINY_BERT`, `TINY_GPT2`,
`TINY_VIT`, `TINY_MARIAN`), the BERT vocabulary, the GPT-2 BPE corpus and the
Marian corpora. Each `save_tiny_*` writes into a directory it is given and
returns the paths; the fixtures in `tests/conftest.py` call them."""

import io
import json
import random

# --- perturbed weights ------------------------------------------------------


def perturbed(model, seed):
    """Every parameter moved by 0.05·N(0, 1), so no bias is 0 and no norm is identity."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


# --- BERT -------------------------------------------------------------------

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


def save_tiny_bert_checkpoints(root):
    """Random-weight tiny `transformers` BERT checkpoints saved under `root`.

    Returns `{"model": dir, "masked_lm": dir, "classifier": dir}`: a
    `BertModel`, a `BertForMaskedLM` and a 3-class
    `BertForSequenceClassification`, each with `config.json`,
    `model.safetensors` and the tokenizer files `transformers` writes.
    """
    import torch
    import transformers

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
        perturbed(model, seed).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path
    return paths


# --- GPT-2 ------------------------------------------------------------------

GPT2_CORPUS = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a man is eating food",
    "a woman is playing the violin",
    "the new movie is awesome!",
    "Hello world, naïve café — 東京 🙂",
    "Transformers process sequences with self-attention.",
    "   leading and trailing spaces   ",
    "numbers 12345 and   tabs\tand\nnewlines",
]
TINY_GPT2 = dict(
    n_positions=32, n_embd=32, n_layer=2, n_head=4,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
)


def save_tiny_gpt2_checkpoints(root):
    """Random-weight tiny `transformers` GPT-2 checkpoints with a byte-level
    BPE trained on `GPT2_CORPUS`: `{"lm": GPT2LMHeadModel dir, "model": GPT2Model dir}`,
    each with `config.json`, `model.safetensors` and the tokenizer files
    `transformers` writes (`tokenizer.json`); `vocab.json` and `merges.txt`
    lie in their parent folder."""
    import tokenizers
    import torch
    import transformers

    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator(
        GPT2_CORPUS * 4, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False
    )
    trainer.save_model(str(root))
    tokenizer = transformers.GPT2TokenizerFast(vocab=str(root / "vocab.json"), merges=str(root / "merges.txt"))
    config = transformers.GPT2Config(vocab_size=len(tokenizer), **TINY_GPT2)
    torch.manual_seed(0)
    models = {"lm": transformers.GPT2LMHeadModel(config), "model": transformers.GPT2Model(config)}
    paths = {}
    for seed, (name, model) in enumerate(models.items()):
        path = root / name
        perturbed(model, seed + 10).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path
    return paths


# --- ViT --------------------------------------------------------------------

TINY_VIT = dict(
    image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)
VIT_LABELS = {0: "cat", 1: "dog", 2: "bird"}


def save_tiny_vit_checkpoints(root):
    """Random-weight tiny `transformers` ViT checkpoints:
    `{"model": ViTModel (with pooler), "no_pooler": ViTModel without it,
    "classifier": 3-class ViTForImageClassification, "masked_image_modeling":
    ViTForMaskedImageModeling}`."""
    import torch
    import transformers

    torch.manual_seed(0)
    models = {
        "model": transformers.ViTModel(transformers.ViTConfig(**TINY_VIT)),
        "no_pooler": transformers.ViTModel(transformers.ViTConfig(**TINY_VIT), add_pooling_layer=False),
        "classifier": transformers.ViTForImageClassification(
            transformers.ViTConfig(
                **TINY_VIT, id2label=VIT_LABELS, label2id={v: k for k, v in VIT_LABELS.items()}
            )
        ),
        "masked_image_modeling": transformers.ViTForMaskedImageModeling(
            transformers.ViTConfig(**TINY_VIT, encoder_stride=8)
        ),
    }
    paths = {}
    for seed, (name, model) in enumerate(models.items()):
        paths[name] = root / name
        perturbed(model, seed + 20).save_pretrained(paths[name])
    return paths


# --- Marian MT --------------------------------------------------------------

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


def save_tiny_marian_tokenizer_files(directory):
    """Writes into `directory` a Marian hub repo's tokenizer files: `source.spm`,
    `target.spm`, `vocab.json` and `tokenizer_config.json`.

    Two SentencePiece unigram models (source 100 pieces, target 110) share
    `vocab.json`, laid out as OPUS-MT's are: `</s>` = 0, `<unk>` = 1, the
    language codes, the union of both models' pieces in shuffled order, and
    `<pad>` last. One source piece is left out of the vocabulary, so it
    becomes `<unk>`.
    """
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


def save_tiny_marian_checkpoint(directory, tokenizer_files):
    """A random-weight tiny `transformers` `MarianMTModel` saved with the
    tokenizer files in `tokenizer_files` (see `save_tiny_marian_tokenizer_files`):
    a Marian hub repo.

    Weights are drawn with a large `init_std` and every trainable parameter (and the
    logits bias) is then moved by 0.1·N(0, 1), so that no bias is 0, no norm
    is the identity, and the decoding of random weights does not settle on
    one repeated token at once.
    """
    import shutil

    import torch
    import transformers

    vocabulary = json.loads((tokenizer_files / "vocab.json").read_text(encoding="utf-8"))
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
    model.save_pretrained(directory)
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_files / name, directory / name)
    return directory
