"""Numerical verification of converted presets against their reference
implementation (`transformers`), one function per model family.

A verifier takes our model (as loaded from the native preset) and the
`PresetSource` of the upstream checkpoint it was converted from, runs both
on the same random inputs (fixed seed), and returns a dict:

- `reference`: the reference class that ran, e.g. `"transformers.BertModel"`;
- `inputs`: what the inputs were, in words;
- `max_abs_difference`: `{output name: max |ours - reference|}`.

The CLI (`azk-convert verify`) adds the tolerance, backend and
versions and records the result in the preset's `metadata.json` and model
card. Verifiers are registered by family name (`VERIFIERS`); `verifier_for`
says which one applies to a preset, or why none does.

A preset whose `config_overrides` change its source's architecture is
verified only where its family's verifier declares that it handles those
overrides (`register(family, overrides=...)`): the verifier then reads our
model's configuration and runs a reference of the same architecture (GPT-2
with linear attention: `transformers.GPT2Model` whose attention function is
`linear_attention_reference`). The inputs and the comparison every
verifier shares are in `reference_comparison`.
"""

import math

import numpy as np

from attention_zoo_keras.hub.optional_modules import optional_module
from attention_zoo_keras.conversion.linear_attention_reference import LINEAR_ATTENTION_EPS
from attention_zoo_keras.conversion.linear_attention_reference import LINEAR_REFERENCE
from attention_zoo_keras.conversion.linear_attention_reference import register_linear_reference
from attention_zoo_keras.conversion.reference_comparison import BATCH_SIZE
from attention_zoo_keras.conversion.reference_comparison import SEED
from attention_zoo_keras.conversion.reference_comparison import max_abs_difference
from attention_zoo_keras.conversion.reference_comparison import random_token_batch
from attention_zoo_keras.conversion.reference_comparison import reference_directory
from attention_zoo_keras.conversion.state_dict import read_state_dict

TOLERANCE = 1e-4  # absolute, fp32

VERIFIERS = {}
# {family: {config key: values}}: the `config_overrides` a family's verifier
# handles (it reads the model's configuration and runs a matching reference).
HANDLED_OVERRIDES = {}
# Families whose reference implementation cannot be installed next to this
# library, and where their converters are checked instead.
NO_INSTALLABLE_REFERENCE = {
    "transformer_xl": "transformers removed Transformer-XL in 5.0 (4.37.2, its last working release, is not "
    "installable next to this library's transformers); the library's tests check the converter against golden "
    "outputs of transformers 4.37.2 (fixtures/transfo_xl)",
    "vilbert": "the reference is the authors' vilbert-multi-task code, which needs PyTorch 1.x; the library's "
    "tests check the converter (`azk-convert vilbert`) against golden outputs of that code "
    "(fixtures/vilbert)",
}


class NoVerifierError(ValueError):
    """No verifier applies to this preset (family, class or architecture)."""


def register(family, overrides=None):
    """Decorator: `function(model, source)` verifies the presets of `family`.

    Args:
        family: str. The backbone's `family`.
        overrides: dict or None. `{config key: tuple of values}`, the
            `config_overrides` (a preset's changes to its source's
            architecture) that the verifier handles; any other override
            means it has no reference.
    """

    def decorate(function):
        VERIFIERS[family] = function
        HANDLED_OVERRIDES[family] = {key: tuple(values) for key, values in (overrides or {}).items()}
        return function

    return decorate


def verifier_for(family, class_name=None, config_overrides=None):
    """The verifier function for a preset, or raises `NoVerifierError`
    saying why there is none."""
    handled = HANDLED_OVERRIDES.get(family, {})
    unhandled = sorted(key for key, value in (config_overrides or {}).items() if value not in handled.get(key, ()))
    if unhandled:
        raise NoVerifierError(
            f"the preset changes the architecture of its source ({', '.join(unhandled)}), "
            "so the reference implementation computes something else"
        )
    if family in NO_INSTALLABLE_REFERENCE:
        raise NoVerifierError(NO_INSTALLABLE_REFERENCE[family])
    if family not in VERIFIERS:
        raise NoVerifierError(
            f"no verifier for the '{family}' family (verifiers exist for: {', '.join(sorted(VERIFIERS))})"
        )
    return VERIFIERS[family]


def unverifiable_reason(entry):
    """Why no verifier applies to a catalog entry (`azk.list_presets()`
    value), or `None` if one does."""
    try:
        verifier_for(entry["family"], entry["class_name"], entry.get("config_overrides"))
    except NoVerifierError as reason:
        return str(reason)
    return None


def _modules():
    try:
        torch = optional_module("torch", "Running the reference implementation")
        transformers = optional_module("transformers", "Running the reference implementation")
    except ImportError as error:  # pragma: no cover - both are in the test env
        raise NoVerifierError(str(error)) from error
    return torch, transformers


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
    rng, token_ids, mask = random_token_batch(config)
    length = token_ids.shape[1]
    segment_ids = rng.integers(0, config["num_segments"], (BATCH_SIZE, length)).astype("int32")
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
        differences["logits"] = max_abs_difference(model({**ours, "mask_positions": positions}), expected, real)
    elif name == "BertTextClassifier":
        reference_cls = transformers.BertForSequenceClassification
        reference = reference_cls.from_pretrained(directory).eval()
        with torch.no_grad():
            expected = reference(**theirs).logits.numpy()
        differences["logits"] = max_abs_difference(model(ours), expected)
    else:
        reference_cls = transformers.BertModel
        keys = read_state_dict(source).keys()
        has_pooler = any(key.endswith("pooler.dense.weight") for key in keys)
        reference = reference_cls.from_pretrained(directory, add_pooling_layer=has_pooler).eval()
        with torch.no_grad():
            expected = reference(**theirs)
        outputs = backbone(ours)
        differences["sequence_output"] = max_abs_difference(
            outputs["sequence_output"], expected.last_hidden_state.numpy(), real
        )
        if has_pooler:
            differences["pooled_output"] = max_abs_difference(outputs["pooled_output"], expected.pooler_output.numpy())
    return {
        "reference": f"transformers.{reference_cls.__name__}",
        "inputs": f"random token and segment ids (seed {SEED}), {BATCH_SIZE} sequences of {length}, one right-padded",
        "max_abs_difference": differences,
    }


def _gpt_attention(backbone):
    """`"softmax"` or `"linear"` (with the paper's feature map and eps), or
    raises `NoVerifierError`: the GPT-2 reference has no other attention."""
    attention = getattr(backbone, "attention", "softmax")
    options = dict(getattr(backbone, "attention_options", None) or {})
    if attention == "linear":
        options.pop("chunk_size", None)  # how it is computed, not what
        feature_map = options.pop("feature_map", "elu_plus_one")
        eps = options.pop("eps", LINEAR_ATTENTION_EPS)
        if feature_map == "elu_plus_one" and eps == LINEAR_ATTENTION_EPS and not options:
            return attention
    elif attention == "softmax" and not options:
        return attention
    raise NoVerifierError(
        f"the GPT verifier runs softmax attention and linear attention (elu+1, eps {LINEAR_ATTENTION_EPS:g}); "
        f"this model has attention='{attention}' with options {getattr(backbone, 'attention_options', None) or {}}"
    )


@register("gpt", overrides={"attention": ("softmax", "linear"), "attention_dropout": (0.0,)})
def verify_gpt(model, source):
    """GPTCausalLM against `GPT2LMHeadModel` (logits), GPTBackbone against
    `GPT2Model` (sequence output), on right-padded random ids, compared at
    the real positions.

    With `attention="linear"` in our model's config (a preset's override, or
    a preset converted with it: the source need not say so), the reference
    is the same transformers model loaded from the same checkpoint with its
    attention function replaced by `causal_linear_attention_reference`
    (registered in `transformers.AttentionInterface`). Real positions never
    see padded keys (causal attention, right padding), so the comparison at
    them does not depend on how padding is masked."""
    torch, transformers = _modules()
    name = _check_class(model, {"GPTBackbone", "GPTCausalLM"}, "GPT")
    backbone = _backbone(model)
    attention = _gpt_attention(backbone)
    directory = reference_directory(source)
    config = backbone.get_config()
    _, token_ids, mask = random_token_batch(config)
    length = token_ids.shape[1]
    theirs = {"input_ids": torch.tensor(token_ids, dtype=torch.long), "attention_mask": torch.tensor(mask)}
    ours = {"token_ids": token_ids, "padding_mask": mask}
    real = mask.astype(bool)
    reference_cls = transformers.GPT2LMHeadModel if name == "GPTCausalLM" else transformers.GPT2Model
    options = {}
    if attention == "linear":
        options["attn_implementation"] = register_linear_reference(transformers)
    reference = reference_cls.from_pretrained(directory, **options).eval()
    if attention == "linear" and reference.config._attn_implementation != LINEAR_REFERENCE:
        raise RuntimeError(
            f"transformers did not take the linear reference attention (it uses "
            f"'{reference.config._attn_implementation}')"
        )
    with torch.no_grad():
        expected = reference(**theirs)
    if name == "GPTCausalLM":
        differences = {"logits": max_abs_difference(model(ours), expected.logits.numpy(), real)}
    else:
        differences = {
            "sequence_output": max_abs_difference(
                model(ours)["sequence_output"], expected.last_hidden_state.numpy(), real
            )
        }
    described = f"transformers.{reference_cls.__name__}"
    if attention == "linear":
        described += " with linear attention (Katharopoulos et al. 2020, elu+1)"
    return {
        "reference": described,
        "inputs": f"random token ids (seed {SEED}), {BATCH_SIZE} sequences of {length}, one right-padded; "
        "compared at the real positions (causal: they never see padded keys)",
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
        differences = {"logits": max_abs_difference(model(ours), expected)}
    else:
        reference_cls = transformers.ViTModel
        use_pooler = bool(backbone.get_config().get("use_pooler"))
        reference = reference_cls.from_pretrained(directory, add_pooling_layer=use_pooler).eval()
        with torch.no_grad():
            expected = reference(theirs)
        outputs = backbone(ours)
        differences = {
            "sequence_output": max_abs_difference(outputs["sequence_output"], expected.last_hidden_state.numpy())
        }
        if use_pooler:
            differences["pooled_output"] = max_abs_difference(outputs["pooled_output"], expected.pooler_output.numpy())
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
    hf_config = source.config() or {}
    if hf_config.get("model_type") != "marian":
        raise NoVerifierError(
            f"the Transformer verifier runs Marian checkpoints; '{source.description}' is "
            f"'{hf_config.get('model_type')}'"
        )
    directory = reference_directory(source)
    config = model.backbone.get_config()
    target_vocabulary = config.get("target_vocabulary_size") or config["vocabulary_size"]
    rng, encoder_ids, encoder_mask = random_token_batch(config)
    length = encoder_ids.shape[1]
    decoder_ids = rng.integers(0, target_vocabulary, (BATCH_SIZE, length)).astype("int32")
    decoder_ids[:, 0] = hf_config.get("decoder_start_token_id", hf_config.get("pad_token_id", 0))
    decoder_mask = encoder_mask[::-1].copy()  # the other row padded
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
        "max_abs_difference": {"logits": max_abs_difference(logits, expected, decoder_mask.astype(bool))},
    }


def reformer_verify_length(config, longest=256):
    """The longest sequence up to `longest` that the Reformer takes: within its
    positions (the axial shape's product) and a multiple of both chunk lengths."""
    positions = math.prod(config["axial_pos_shape"])
    if config.get("max_sequence_length"):
        positions = min(positions, int(config["max_sequence_length"]))
    options = config["attention_options"]
    chunk = math.lcm(int(options["lsh"]["chunk_length"]), int(options["local"]["block_size"]))
    length = min(longest, positions) // chunk * chunk
    return max(length, chunk)


REFORMER_ROTATION_SEED = 1234


def _shared_reformer_rotations(model, reference, torch):
    """Makes both Reformers hash with the same random rotations: transformers'
    `hash_seed` is fixed, and the rotations it draws from that seed
    (`torch.manual_seed; torch.randn`) are handed to our LSH layers
    (`ReformerBackbone.set_lsh_rotations`). Returns whether the model has LSH
    layers."""
    for module in reference.modules():
        if hasattr(module, "hash_seed"):
            module.hash_seed = REFORMER_ROTATION_SEED
    backbone = model.backbone
    if not any(branch.attention == "lsh" for branch in backbone.attention_branches):
        return False
    torch.manual_seed(REFORMER_ROTATION_SEED)
    backbone.set_lsh_rotations(torch.randn(backbone.lsh_rotations_shape).numpy())
    return True


@register("reformer")
def verify_reformer(model, source, length=None):
    """ReformerCausalLM against `ReformerModelWithLMHead` (logits of random
    ids, `length` tokens, by default `reformer_verify_length`), both hashing
    with the same LSH rotations. transformers 5.0-5.23 leave out the LM
    head's bias, which the original model adds (5.24 adds it again, as
    `lm_head.decoder.bias`), so it is added to their logits where missing."""
    torch, transformers = _modules()
    _check_class(model, {"ReformerCausalLM"}, "Reformer")
    directory = reference_directory(source)
    length = length or reformer_verify_length(model.backbone.get_config())
    reference = transformers.ReformerModelWithLMHead.from_pretrained(directory).eval()
    hashes = _shared_reformer_rotations(model, reference, torch)
    token_ids = np.random.default_rng(SEED).integers(0, model.backbone.vocabulary_size, (BATCH_SIZE, length))
    try:
        with torch.no_grad():
            expected = reference(torch.tensor(token_ids)).logits.numpy()
            if reference.lm_head.decoder.bias is None:
                expected = expected + reference.lm_head.bias.numpy()
        logits = model({"token_ids": token_ids.astype("int32"), "padding_mask": np.ones_like(token_ids, "int32")})
    finally:
        if hashes:
            model.backbone.set_lsh_rotations(None)
    return {
        "reference": "transformers.ReformerModelWithLMHead",
        "inputs": f"random token ids (seed {SEED}), {BATCH_SIZE} sequences of {length}, the same LSH rotations "
        f"(hash seed {REFORMER_ROTATION_SEED})",
        "max_abs_difference": {"logits": max_abs_difference(logits, expected)},
    }
