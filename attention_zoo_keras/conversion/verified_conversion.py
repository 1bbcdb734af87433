"""A checkpoint converted into a native preset that is kept only when it
matches its reference: `convert_one` saves the converted model in a staging
directory, `verify_preset` runs it and the reference on the same inputs and
records the parity (the largest |ours - reference| of each output, the
tolerance, the backend and the versions) in the preset's metadata and model
card; a preset that failed is not moved into place (`ParityError`).
"""

import datetime
import importlib.metadata
import math

import keras

import attention_zoo_keras as azk
from attention_zoo_keras.conversion import state_dict
from attention_zoo_keras.conversion.command_arguments import UsageError
from attention_zoo_keras.conversion.command_arguments import native_config
from attention_zoo_keras.conversion.verifiers import TOLERANCE
from attention_zoo_keras.conversion.verifiers import NoVerifierError
from attention_zoo_keras.conversion.verifiers import verifier_for
from attention_zoo_keras.hub.catalog import UnknownPresetError
from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.preset_format import is_native
from attention_zoo_keras.hub.preset_format import record_parity
from attention_zoo_keras.hub.preset_format import record_source
from attention_zoo_keras.hub.preset_format import staged_preset
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.registration import registered_class


class ParityError(Exception):
    """The converted preset differs from the reference above the tolerance."""

    def __init__(self, parity):
        self.parity = parity
        worst = max(parity["max_abs_difference"].values(), default=float("nan"))
        super().__init__(f"parity FAILED: max |ours - reference| {worst:.2e} > tolerance {parity['tolerance']:g}")


def _family(model):
    """The family of a backbone, or of a task's backbone."""
    return getattr(model, "backbone", model).family


def _check_reference_family(source, reference, family, directory):
    """`UsageError` unless the reference `source` is a `transformers`
    checkpoint of `family`, the family of the preset in `directory` (a
    checkpoint of another family would be loaded into the wrong
    `transformers` class)."""
    reference_config = source.config()
    if is_native(reference_config):
        raise UsageError(
            f"--reference '{reference}' is a preset of attention_zoo_keras, not a transformers checkpoint: "
            "give the checkpoint the preset was converted from."
        )
    try:
        converter = converter_for(reference_config, source.description)
    except ValueError as error:
        raise UsageError(f"--reference: {error}") from error
    if converter.backbone_cls.family != family:
        raise UsageError(
            f"--reference '{reference}' is a transformers '{converter.model_type}' checkpoint "
            f"({converter.backbone_cls.family}), but the preset in '{directory}' is a {family} model."
        )


def _versions():
    """The versions of this library, Keras, and the packages the reference
    and the backend run on."""
    versions = {"attention_zoo_keras": azk.__version__, "keras": keras.__version__}
    backend = keras.backend.backend()
    for package in ("transformers", "torch", {"jax": "jax", "tensorflow": "tensorflow"}.get(backend)):
        if package and package not in versions:
            try:
                versions[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                pass
    return versions


def verify_preset(directory, reference):
    """Runs the native preset in `directory` and the reference implementation
    on `reference` (a handle) on the same inputs, and records the parity in
    the preset. Returns the parity record.

    Args:
        directory: str or Path. A native preset directory.
        reference: str. The checkpoint it was converted from:
            `hf://org/repo[@revision]`, a local `transformers` directory, or
            a named preset.

    Raises:
        UsageError: `directory` is no native preset, or `reference` is unknown.
        NoVerifierError: no verifier applies.
    """
    config = native_config(directory)
    try:
        source = PresetSource.of(reference)
    except (UnknownPresetError, PresetFileError) as error:
        raise UsageError(f"--reference: {error}") from error
    model_cls = registered_class(config["class_name"], source=f"config.json of '{directory}'")
    model = model_cls.from_preset(str(directory))
    _check_reference_family(source, reference, _family(model), directory)
    verifier = verifier_for(_family(model), type(model).__name__, source.config_overrides)
    result = verifier(model, source)
    differences = result["max_abs_difference"]
    passed = bool(differences) and all(math.isfinite(value) and value <= TOLERANCE for value in differences.values())
    parity = {
        "passed": passed,
        "reference": result["reference"],
        "source": str(reference),
        "max_abs_difference": differences,
        "tolerance": TOLERANCE,
        "dtype": "float32",
        "inputs": result.get("inputs"),
        "backend": keras.backend.backend(),
        "versions": _versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    record_parity(directory, parity)
    return parity


def difference_lines(parity):
    """One line per output of a parity record: its max |ours - reference|.

    Args:
        parity: dict. A parity record (`verify_preset`).
    """
    tolerance = parity["tolerance"]
    return [
        f"  max |ours - reference| {name}: {value:.2e} (tolerance {tolerance:g})"
        for name, value in parity["max_abs_difference"].items()
    ]


def _save_converted(model, handle, entry, directory, echo):
    """Saves a converted model as a native preset in `directory`: a backbone
    with its family's preprocessor (so that its tasks can be built from the
    preset), and the source checkpoint recorded in the metadata and card."""
    model.save_to_preset(directory)
    if getattr(model, "preprocessor", None) is None:
        preprocessor = state_dict.source_preprocessor(handle)
        if preprocessor is None:
            echo(f"note: {handle} has no tokenizer files; the preset has no preprocessor")
        else:
            preprocessor.save_to_preset(directory)
    record_source(directory, entry.get("source", str(handle)), entry.get("license"), entry.get("description"))


def convert_one(handle, model_cls, out, verify=True, entry=None, echo=print):
    """Converts `handle` into a `model_cls` native preset at `out`; unless
    `verify` is false, verifies it. Returns the parity record (or `None`).

    The preset is saved and verified in a staging directory next to `out`
    and moved into place only when it passed (or was not verified). `out`
    is checked first, before anything is downloaded or converted.

    Args:
        handle: str. A named preset, `hf://org/repo[@revision]` or a local
            `transformers` directory.
        model_cls: type. The backbone or task class to build.
        out: str or Path. Where the native preset goes.
        verify: bool. Whether to compare it with the reference.
        entry: dict or None. The named preset's catalog entry (its source,
            license, description and `config_overrides`).
        echo: callable. Prints a line of progress.

    Raises:
        ParityError: the converted model differs from the reference above
            the tolerance; `out` is left as it was.
        DirectoryNotReplaceableError: `out` is a directory that is neither
            empty nor a native preset; nothing in it is touched.
    """
    entry = entry or {}
    parity = None
    with staged_preset(out) as staging:
        model = state_dict.convert(model_cls, handle)
        family = _family(model)
        _save_converted(model, handle, entry, staging, echo)
        if verify:
            try:
                verifier_for(family, type(model).__name__, entry.get("config_overrides"))
            except NoVerifierError as reason:
                echo(f"not verified: {reason}")
            else:
                del model
                parity = verify_preset(staging, handle)
                for line in difference_lines(parity):
                    echo(line)
                if not parity["passed"]:
                    raise ParityError(parity)
                echo(f"parity against {parity['reference']}: passed")
    echo(f"saved {model_cls.__name__} from {handle} to {out}")
    return parity

