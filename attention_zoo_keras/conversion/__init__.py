"""Conversion of upstream checkpoints into native presets: the `azk-convert`
command line (`python -m attention_zoo_keras.conversion`; from a checkout,
also `python -m conversion`).

It is the top layer of the package: it uses the models and the hub code,
and nothing in the library imports it. PyTorch and `transformers` are
optional: only the commands that read a `.bin` or run the reference need
them, and they say which extra to install (`hub.optional_modules`).

Modules:
    cli: the commands (`list`, `convert`, `verify`, `publish`, `vilbert`).
    command_arguments: what the commands take, checked (`UsageError`).
    verified_conversion: a checkpoint to a native preset kept only when it
        matches its reference (`convert_one`, `verify_preset`).
    state_dict: reading a checkpoint's tensors (safetensors, or a `.bin`
        strictly with `torch.load(weights_only=True)`).
    verifiers: the numerical comparison with `transformers`, per family.
    reference_comparison: the inputs and comparison every verifier shares.
    linear_attention_reference: causal linear attention in torch, the GPT
        verifier's reference for linear-attention presets.
    vilbert: the `vilbert` command: the ViLBERT authors' checkpoints to
        one native preset.
    vilbert_conversion: their checkpoint onto one backbone with its heads.
    vilbert_verification: the converted preset loads back unchanged.
"""
