"""The `README.md` model card written into every saved preset.

It opens with the YAML block the Hugging Face Hub reads (library, tags,
pipeline tag; `license` and `base_model` once the source is recorded), names
the architecture and its paper, shows how to load the preset with this
library (the snippet names the repo once published: `for_repository`) and
lists the configuration. Conversion adds a "Source" section (`with_source`)
and verification a "Parity" section (`with_parity_section`).
"""

PIPELINE_TAGS = {
    "BertMaskedLM": "fill-mask",
    "BertTextClassifier": "text-classification",
    "BertTextEmbedder": "sentence-similarity",
    "BertBackbone": "feature-extraction",
    "GPTBackbone": "feature-extraction",
    "GPTCausalLM": "text-generation",
    "ReformerBackbone": "feature-extraction",
    "ReformerCausalLM": "text-generation",
    "ReformerMaskedLM": "fill-mask",
    "ReformerTextClassifier": "text-classification",
    "TransformerBackbone": "feature-extraction",
    "TransformerSeq2SeqLM": "translation",
    "TransformerXLBackbone": "feature-extraction",
    "TransformerXLCausalLM": "text-generation",
    "ViLBERTBackbone": "feature-extraction",
    "ViLBERTVisualQuestionAnswerer": "visual-question-answering",
    "ViTBackbone": "image-feature-extraction",
    "ViTImageClassifier": "image-classification",
}

# One sentence on each family's architecture and its paper.
ARCHITECTURES = {
    "bert": "BERT (Devlin et al., 2019): a bidirectional Transformer encoder over WordPiece tokens with "
    "token, position and segment embeddings, pretrained by masked language modelling.",
    "gpt": "GPT-2 (Radford et al., 2019): a decoder-only Transformer with pre-layer-norm blocks and learned "
    "positions, trained to predict the next byte-level BPE token.",
    "reformer": "Reformer (Kitaev et al., 2020): locality-sensitive-hashing and chunked local attention, "
    "reversible residual layers and chunked feed-forward layers, for long sequences.",
    "transformer": "The Transformer (Vaswani et al., 2017): an encoder-decoder of multi-head attention and "
    "feed-forward layers, here as in Marian's translation models.",
    "transformer_xl": "Transformer-XL (Dai et al., 2019): a decoder-only Transformer with relative position "
    "attention over a memory of the previous segment, adaptive input and adaptive softmax.",
    "vilbert": "ViLBERT (Lu et al., 2019): a BERT text stream and a stream of image regions, joined by "
    "co-attention layers in which each stream attends to the other.",
    "vit": "ViT (Dosovitskiy et al., 2021): a Transformer encoder over 16x16 (or 32x32) image patches with a "
    "class token and learned positions.",
}


# The usage snippet's handle until the card is published: `upload_preset`
# sends the card with the repo's own handle in its place (`for_repository`).
REPOSITORY_PLACEHOLDER = "hf://<this repo>"


def for_repository(card, handle):
    """`card` with its usage snippet loading from `handle` (the repo it is
    published to).

    Example:

    >>> 'from_preset("hf://me/clf")' in for_repository(model_card("BertBackbone", "bert", 10, {}), "hf://me/clf")
    True
    """
    return card.replace(REPOSITORY_PLACEHOLDER, handle)


def _settings(config, prefix=""):
    """`(name, value)` of every setting in a Keras config; a nested object's
    (a task's backbone) as `backbone.<name>`."""
    for key, value in config.items():
        if isinstance(value, dict) and isinstance(value.get("config"), dict):
            yield from _settings(value["config"], f"{prefix}{key}.")
        elif not isinstance(value, dict):
            yield f"{prefix}{key}", value


def model_card(class_name, family, parameter_count, config):
    """Returns the model card text for a preset.

    Example:

    >>> print(model_card("BertBackbone", "bert", 4_400_000, {}).splitlines()[0])
    ---
    """
    front_matter = ["---", "library_name: attention-zoo-keras", "tags:", "- keras", "- attention-zoo-keras", f"- {family}"]
    if class_name in PIPELINE_TAGS:
        front_matter.append(f"pipeline_tag: {PIPELINE_TAGS[class_name]}")
    front_matter.append("---")
    settings = "\n".join(f"| `{key}` | `{value}` |" for key, value in _settings(config))
    architecture = f"\n{ARCHITECTURES[family]}\n" if family in ARCHITECTURES else ""
    body = f"""
# {class_name}

A `{class_name}` ({family} family, {parameter_count:,} parameters) saved by
[attention_zoo_keras](https://pypi.org/project/attention-zoo-keras/). It runs on
JAX, TensorFlow and PyTorch through Keras 3.
{architecture}
```python
import attention_zoo_keras as azk

model = azk.models.{class_name}.from_preset("{REPOSITORY_PLACEHOLDER}")
```

## Configuration

| setting | value |
|---|---|
{settings}
"""
    return "\n".join(front_matter) + "\n" + body


PARITY_HEADING = "## Parity"


def parity_section(parity):
    """The model card's "Parity" section for a `parity` record (the
    `metadata.json` entry written by `azk-convert verify`).

    Example:

    >>> print(parity_section({"passed": True, "reference": "transformers.BertModel", "tolerance": 1e-4,
    ...     "backend": "jax", "max_abs_difference": {"sequence_output": 2e-7}}).splitlines()[0])
    ## Parity
    """
    status = "passed" if parity.get("passed") else "FAILED"
    versions = ", ".join(f"{name} {version}" for name, version in parity.get("versions", {}).items())
    lines = [
        PARITY_HEADING,
        "",
        f"Verified against `{parity.get('reference')}` ({status}, tolerance {parity.get('tolerance'):g} "
        f"absolute, {parity.get('dtype', 'float32')}) on the {parity.get('backend')} backend"
        + (f", with {versions}" if versions else "")
        + ".",
    ]
    if parity.get("inputs"):
        lines += ["", f"Inputs: {parity['inputs']}."]
    lines += ["", "| output | max abs difference |", "|---|---|"]
    lines += [f"| `{name}` | {value:.2e} |" for name, value in parity.get("max_abs_difference", {}).items()]
    return "\n".join(lines) + "\n"


def _with_section(card, heading, section):
    """`card` with its section under `heading` replaced by (or appended as)
    `section`."""
    lines = card.splitlines()
    if heading in lines:
        start = lines.index(heading)
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ") or lines[i].startswith("# ")),
            len(lines),
        )
        lines = lines[:start] + lines[end:]
    text = "\n".join(lines).rstrip("\n")
    return text + "\n\n" + section


def with_parity_section(card, parity):
    """`card` with its "Parity" section replaced by (or appended as) the one
    of `parity`."""
    return _with_section(card, PARITY_HEADING, parity_section(parity))


SOURCE_HEADING = "## Source"


def _with_front_matter(card, key, value):
    """`card` with `key: value` set in its YAML block."""
    lines = card.splitlines()
    if not lines or lines[0] != "---" or "---" not in lines[1:]:
        return card
    end = lines.index("---", 1)
    block = [line for line in lines[1:end] if not line.startswith(f"{key}:")]
    return "\n".join(["---", *block, f"{key}: {value}", *lines[end:]]) + "\n"


def with_source(card, source, license_name=None, description=None):
    """`card` naming the checkpoint the preset was converted from: a
    "Source" section (with the named preset's `description`, if any), the
    Hub repo as `base_model` in the YAML block (for an
    `hf://org/repo[@revision]` source), and `license_name` as its license.

    Example:

    >>> card = with_source(model_card("BertBackbone", "bert", 10, {}), "hf://google-bert/bert-base-uncased", "apache-2.0")
    >>> "base_model: google-bert/bert-base-uncased" in card and "license: apache-2.0" in card
    True
    """
    from attention_zoo_keras.hub.source import HF_PREFIX

    if source.startswith(HF_PREFIX):
        card = _with_front_matter(card, "base_model", source[len(HF_PREFIX) :].partition("@")[0])
    if license_name:
        card = _with_front_matter(card, "license", license_name)
    section = (
        f"{SOURCE_HEADING}\n\nConverted from `{source}` by attention_zoo_keras' `conversion` tools "
        "(the library's own weight mapping; PyTorch `.bin` files read with `torch.load(weights_only=True)`).\n"
    )
    if description:
        section += f"\n{description}\n"
    return _with_section(card, SOURCE_HEADING, section)
