"""Numerical verification of converted presets against their reference
implementation (`transformers`), one function per model family.

A verifier takes our model (as loaded from the native preset) and the
`PresetSource` of the upstream checkpoint it was converted from, runs both
on the same random inputs (fixed seed), and returns a dict:

- `reference`: the reference class that ran, e.g. `"transformers.BertModel"`;
- `inputs`: what the inputs were, in words;
- `max_abs_difference`: `{output name: max |ours - reference|}`.

The CLI (`python -m conversion verify`) adds the tolerance, backend and
versions and records the result in the preset's `metadata.json` and model
card. Verifiers are registered by family name (`VERIFIERS`); `verifier_for`
says which one applies to a preset, or why none does.
"""

import numpy as np

SEED = 0
TOLERANCE = 1e-4  # absolute, fp32
# How long the random sequences are (at most; shorter if the model is).
SEQUENCE_LENGTH = 16
BATCH_SIZE = 2

VERIFIERS = {}


class NoVerifierError(ValueError):
    """No verifier applies to this preset (family, class or architecture)."""


def register(family):
    def decorate(function):
        VERIFIERS[family] = function
        return function

    return decorate


def verifier_for(family, class_name=None, config_overrides=None):
    """The verifier function for a preset, or raises `NoVerifierError`
    saying why there is none."""
    if config_overrides:
        raise NoVerifierError(
            f"the preset changes the architecture of its source ({', '.join(sorted(config_overrides))}), "
            "so the reference implementation computes something else"
        )
    if family not in VERIFIERS:
        raise NoVerifierError(
            f"no verifier for the '{family}' family (verifiers exist for: {', '.join(sorted(VERIFIERS))})"
        )
    return VERIFIERS[family]


def has_verifier(entry):
    """Whether a catalog entry (`azk.list_presets()` value) can be verified."""
    try:
        verifier_for(entry["family"], entry["class_name"], entry.get("config_overrides"))
    except NoVerifierError:
        return False
    return True


def reference_directory(source):
    """The local directory of a `transformers` checkpoint, its config and
    weights downloaded (through `huggingface_hub` for `hf://` sources)."""
    config_path = source.require("config.json")
    if source.file("model.safetensors") is None and source.file("model.safetensors.index.json") is None:
        source.require("pytorch_model.bin")
    return config_path.parent


def _modules():
    try:
        import torch
        import transformers
    except ImportError as error:  # pragma: no cover - both are in the test env
        raise NoVerifierError(f"the reference implementation needs torch and transformers ({error})") from error
    return torch, transformers


def _numpy(value):
    import keras

    return keras.ops.convert_to_numpy(value)


def _difference(ours, theirs, where=None):
    ours, theirs = np.asarray(_numpy(ours), "float64"), np.asarray(theirs, "float64")
    if ours.shape != theirs.shape:
        raise ValueError(f"output shapes differ: ours {ours.shape}, reference {theirs.shape}")
    if where is not None:
        ours, theirs = ours[where], theirs[where]
    return float(np.max(np.abs(ours - theirs)))


def _padding_mask(batch, length):
    """Ones, but the last row is right-padded to about half its length."""
    mask = np.ones((batch, length), "int32")
    if batch > 1:
        mask[-1, max(1, length // 2) :] = 0
    return mask


def _hf_config(source):
    return source.config() or {}


def _backbone(model):
    return getattr(model, "backbone", model)


def _check_class(model, allowed, family):
    name = type(model).__name__
    if name not in allowed:
        raise NoVerifierError(f"no {family} verifier for the class {name} (only {', '.join(sorted(allowed))})")
    return name


@register("bert")
def verify_bert(model, source):
    """BertBackbone / BertTextEmbedder against `BertModel` (sequence output;
    pooled output when the checkpoint has a pooler), BertMaskedLM against
    `BertForMaskedLM` (logits at every position), BertTextClassifier against
    `BertForSequenceClassification` (logits)."""
    torch, transformers = _modules()
    name = _check_class(model, {"BertBackbone", "BertTextEmbedder", "BertMaskedLM", "BertTextClassifier"}, "BERT")
    directory = reference_directory(source)
    backbone = _backbone(model)
    config = backbone.get_config()
    rng = np.random.default_rng(SEED)
    length = min(SEQUENCE_LENGTH, config["max_sequence_length"])
    token_ids = rng.integers(0, config["vocabulary_size"], (BATCH_SIZE, length)).astype("int32")
    segment_ids = rng.integers(0, config["num_segments"], (BATCH_SIZE, length)).astype("int32")
    mask = _padding_mask(BATCH_SIZE, length)
    theirs = {
        "input_ids": torch.tensor(token_ids, dtype=torch.long),
        "token_type_ids": torch.tensor(segment_ids, dtype=torch.long),
        "attention_mask": torch.tensor(mask, dtype=torch.long),
    }
    ours = {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": mask}
    real = mask.astype(bool)
    differences = {}
    if name == "BertMaskedLM":
        reference_cls = transformers.BertForMaskedLM
        reference = reference_cls.from_pretrained(directory).eval()
        with torch.no_grad():
            expected = reference(**theirs).logits.numpy()
        positions = np.tile(np.arange(length, dtype="int32"), (BATCH_SIZE, 1))
        differences["logits"] = _difference(model({**ours, "mask_positions": positions}), expected, real)
    elif name == "BertTextClassifier":
        reference_cls = transformers.BertForSequenceClassification
        reference = reference_cls.from_pretrained(directory).eval()
        with torch.no_grad():
            expected = reference(**theirs).logits.numpy()
        differences["logits"] = _difference(model(ours), expected)
    else:
        reference_cls = transformers.BertModel
        from state_dict import read_state_dict

        keys = read_state_dict(source).keys()
        has_pooler = any(key.endswith("pooler.dense.weight") for key in keys)
        reference = reference_cls.from_pretrained(directory, add_pooling_layer=has_pooler).eval()
        with torch.no_grad():
            expected = reference(**theirs)
        outputs = backbone(ours)
        differences["sequence_output"] = _difference(
            outputs["sequence_output"], expected.last_hidden_state.numpy(), real
        )
        if has_pooler:
            differences["pooled_output"] = _difference(outputs["pooled_output"], expected.pooler_output.numpy())
    return {
        "reference": f"transformers.{reference_cls.__name__}",
        "inputs": f"random token and segment ids (seed {SEED}), {BATCH_SIZE} sequences of {length}, one right-padded",
        "max_abs_difference": differences,
    }


@register("gpt")
def verify_gpt(model, source):
    """GPTCausalLM against `GPT2LMHeadModel` (logits), GPTBackbone against
    `GPT2Model` (sequence output), on right-padded random ids."""
    torch, transformers = _modules()
    name = _check_class(model, {"GPTBackbone", "GPTCausalLM"}, "GPT")
    directory = reference_directory(source)
    config = _backbone(model).get_config()
    rng = np.random.default_rng(SEED)
    length = min(SEQUENCE_LENGTH, config["max_sequence_length"])
    token_ids = rng.integers(0, config["vocabulary_size"], (BATCH_SIZE, length)).astype("int32")
    mask = _padding_mask(BATCH_SIZE, length)
    theirs = {"input_ids": torch.tensor(token_ids, dtype=torch.long), "attention_mask": torch.tensor(mask)}
    ours = {"token_ids": token_ids, "padding_mask": mask}
    real = mask.astype(bool)
    if name == "GPTCausalLM":
        reference_cls = transformers.GPT2LMHeadModel
        reference = reference_cls.from_pretrained(directory).eval()
        with torch.no_grad():
            expected = reference(**theirs).logits.numpy()
        differences = {"logits": _difference(model(ours), expected, real)}
    else:
        reference_cls = transformers.GPT2Model
        reference = reference_cls.from_pretrained(directory).eval()
        with torch.no_grad():
            expected = reference(**theirs).last_hidden_state.numpy()
        differences = {"sequence_output": _difference(model(ours)["sequence_output"], expected, real)}
    return {
        "reference": f"transformers.{reference_cls.__name__}",
        "inputs": f"random token ids (seed {SEED}), {BATCH_SIZE} sequences of {length}, one right-padded",
        "max_abs_difference": differences,
    }


@register("vit")
def verify_vit(model, source):
    """ViTImageClassifier against `ViTForImageClassification` (logits),
    ViTBackbone against `ViTModel` (sequence output, and the pooled output
    when ours has a pooler), on random normal images at the model's size."""
    torch, transformers = _modules()
    name = _check_class(model, {"ViTBackbone", "ViTImageClassifier"}, "ViT")
    directory = reference_directory(source)
    backbone = _backbone(model)
    height, width = backbone.image_size
    channels = backbone.get_config()["num_channels"]
    pixels = np.random.default_rng(SEED).normal(size=(BATCH_SIZE, channels, height, width)).astype("float32")
    theirs = torch.from_numpy(pixels)
    ours = {"images": pixels.transpose(0, 2, 3, 1)}
    if name == "ViTImageClassifier":
        reference_cls = transformers.ViTForImageClassification
        reference = reference_cls.from_pretrained(directory).eval()
        with torch.no_grad():
            expected = reference(theirs).logits.numpy()
        differences = {"logits": _difference(model(ours), expected)}
    else:
        reference_cls = transformers.ViTModel
        use_pooler = bool(backbone.get_config().get("use_pooler"))
        reference = reference_cls.from_pretrained(directory, add_pooling_layer=use_pooler).eval()
        with torch.no_grad():
            expected = reference(theirs)
        outputs = backbone(ours)
        differences = {"sequence_output": _difference(outputs["sequence_output"], expected.last_hidden_state.numpy())}
        if use_pooler:
            differences["pooled_output"] = _difference(outputs["pooled_output"], expected.pooler_output.numpy())
    return {
        "reference": f"transformers.{reference_cls.__name__}",
        "inputs": f"random normal images (seed {SEED}), {BATCH_SIZE} of {height}x{width}x{channels}",
        "max_abs_difference": differences,
    }


@register("transformer")
def verify_marian(model, source):
    """TransformerSeq2SeqLM converted from a Marian checkpoint against
    `MarianMTModel` (logits of a teacher-forced decoder pass), on random
    source and target ids; the decoder starts with the checkpoint's
    `decoder_start_token_id`."""
    torch, transformers = _modules()
    _check_class(model, {"TransformerSeq2SeqLM"}, "Transformer")
    hf_config = _hf_config(source)
    if hf_config.get("model_type") != "marian":
        raise NoVerifierError(
            f"the Transformer verifier runs Marian checkpoints; '{source.description}' is "
            f"'{hf_config.get('model_type')}'"
        )
    directory = reference_directory(source)
    config = model.backbone.get_config()
    source_vocabulary = config["vocabulary_size"]
    target_vocabulary = config.get("target_vocabulary_size") or source_vocabulary
    rng = np.random.default_rng(SEED)
    length = min(SEQUENCE_LENGTH, config["max_sequence_length"])
    encoder_ids = rng.integers(0, source_vocabulary, (BATCH_SIZE, length)).astype("int32")
    decoder_ids = rng.integers(0, target_vocabulary, (BATCH_SIZE, length)).astype("int32")
    decoder_ids[:, 0] = hf_config.get("decoder_start_token_id", hf_config.get("pad_token_id", 0))
    encoder_mask = _padding_mask(BATCH_SIZE, length)
    decoder_mask = _padding_mask(BATCH_SIZE, length)[::-1].copy()  # the other row padded
    reference_cls = transformers.MarianMTModel
    reference = reference_cls.from_pretrained(directory).eval()
    with torch.no_grad():
        expected = reference(
            input_ids=torch.tensor(encoder_ids, dtype=torch.long),
            attention_mask=torch.tensor(encoder_mask, dtype=torch.long),
            decoder_input_ids=torch.tensor(decoder_ids, dtype=torch.long),
            decoder_attention_mask=torch.tensor(decoder_mask, dtype=torch.long),
        ).logits.numpy()
    logits = model(
        {
            "encoder_token_ids": encoder_ids,
            "encoder_padding_mask": encoder_mask,
            "decoder_token_ids": decoder_ids,
            "decoder_padding_mask": decoder_mask,
        }
    )
    return {
        "reference": f"transformers.{reference_cls.__name__}",
        "inputs": f"random source and target ids (seed {SEED}), {BATCH_SIZE} pairs of {length}, one of each right-padded",
        "max_abs_difference": {"logits": _difference(logits, expected, decoder_mask.astype(bool))},
    }


def reformer_verify_length(config, longest=256):
    """The longest sequence up to `longest` that the Reformer takes: within its
    positions (the axial shape's product) and a multiple of both chunk lengths."""
    import math

    positions = math.prod(config["axial_pos_shape"])
    if config.get("max_sequence_length"):
        positions = min(positions, int(config["max_sequence_length"]))
    chunk = math.lcm(int(config["lsh_chunk_length"]), int(config["local_chunk_length"]))
    length = min(longest, positions) // chunk * chunk
    return max(length, chunk)


@register("reformer")
def verify_reformer(model, source):
    """ReformerCausalLM against `ReformerModelWithLMHead` (logits), with the
    same LSH rotations: `convert_reformer.verify`."""
    _modules()
    _check_class(model, {"ReformerCausalLM"}, "Reformer")
    import convert_reformer

    reference_directory(source)
    config = model.backbone.get_config()
    length = reformer_verify_length(config)
    difference = convert_reformer.verify(model, source, length)
    return {
        "reference": "transformers.ReformerModelWithLMHead",
        "inputs": f"random token ids (seed {convert_reformer.VERIFY_SEED}), 2 sequences of {length}, shared LSH rotations",
        "max_abs_difference": {"logits": difference},
    }
