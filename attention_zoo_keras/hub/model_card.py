"""The `README.md` model card written into every saved preset.

It opens with the YAML block the Hugging Face Hub reads (library, tags,
license, pipeline tag) and shows how to load the preset with this library.
"""

PIPELINE_TAGS = {
    "BertMaskedLM": "fill-mask",
    "BertTextClassifier": "text-classification",
    "BertTextEmbedder": "sentence-similarity",
    "BertBackbone": "feature-extraction",
    "GPTBackbone": "feature-extraction",
    "GPTCausalLM": "text-generation",
    "TransformerXLBackbone": "feature-extraction",
    "TransformerXLCausalLM": "text-generation",
    "ViTBackbone": "image-feature-extraction",
    "ViTImageClassifier": "image-classification",
}


def model_card(class_name, family, parameter_count, config, license_name=None, base_model=None):
    """Returns the model card text for a preset.

    Example:

    >>> print(model_card("BertBackbone", "bert", 4_400_000, {}).splitlines()[0])
    ---
    """
    front_matter = ["---", "library_name: attention-zoo-keras", "tags:", "- keras", "- attention-zoo-keras", f"- {family}"]
    if class_name in PIPELINE_TAGS:
        front_matter.append(f"pipeline_tag: {PIPELINE_TAGS[class_name]}")
    if license_name:
        front_matter.append(f"license: {license_name}")
    if base_model:
        front_matter.append(f"base_model: {base_model}")
    front_matter.append("---")
    settings = "\n".join(
        f"| `{key}` | `{value}` |" for key, value in config.items() if not isinstance(value, dict)
    )
    body = f"""
# {class_name}

A `{class_name}` ({family} family, {parameter_count:,} parameters) saved by
[attention_zoo_keras](https://pypi.org/project/attention-zoo-keras/). It runs on
JAX, TensorFlow and PyTorch through Keras 3.

```python
import attention_zoo_keras as azk

model = azk.models.{class_name}.from_preset("hf://<this repo>")
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
    `metadata.json` entry written by `python -m conversion verify`).

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


def with_parity_section(card, parity):
    """`card` with its "Parity" section replaced by (or appended as) the one
    of `parity`."""
    lines = card.splitlines()
    if PARITY_HEADING in lines:
        start = lines.index(PARITY_HEADING)
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ") or lines[i].startswith("# ")),
            len(lines),
        )
        lines = lines[:start] + lines[end:]
    text = "\n".join(lines).rstrip("\n")
    return text + "\n\n" + parity_section(parity)
