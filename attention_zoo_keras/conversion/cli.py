"""`azk-convert`: convert upstream checkpoints into native
attention_zoo_keras presets, verify them against the reference
implementation, and publish them to the Hugging Face Hub.

Usage (installed with the package; also `python -m attention_zoo_keras.conversion`,
and `python -m conversion` from a checkout):

    azk-convert list [--family FAMILY]
    azk-convert convert PRESET --out DIR [--no-verify]
    azk-convert convert SRC --class CLASS --out DIR [--no-verify]
    azk-convert convert --all --out DIR [--no-verify]
    azk-convert verify DIR --reference SRC
    azk-convert publish DIR hf://org/name [--revision R] [--private]
    azk-convert vilbert CHECKPOINT CONFIG DEST [--vocab VOCAB] [--task TASK ...]

PRESET is a named preset (`azk-convert list`); its JSON says which
checkpoint to download and which class to build. SRC is `hf://org/repo[@rev]`
or a local directory in `transformers` format, and then `--class` names the
class to build (`BertBackbone`, `GPTCausalLM`, ...). Downloads go through
`huggingface_hub` (its cache; `HF_ENDPOINT` and `HF_HUB_OFFLINE` apply);
the weights are mapped by the library's own converters.

`convert` saves the preset (a backbone with its family's preprocessor, so
that tasks can be built from it) in a staging directory next to `--out`,
records the source checkpoint, loads it back and, unless `--no-verify`,
runs it and the reference (`transformers`) on the same random inputs: the
largest |ours - reference| of each output, the tolerance (1e-4, fp32), the
backend and the versions are recorded under "parity" in `metadata.json` and
as a "Parity" section of the model card (`README.md`). Only a preset that
passed (or has no verifier, or `--no-verify`) is moved to `--out`; a failed
one leaves `--out` as it was. `--out` must be missing, empty, or a native
preset of this library (files in it that the preset did not write are
kept); any other directory is refused before anything is converted, and
nothing in it is touched. `verify` does the same check for an existing
native preset. `--all` converts every named preset into DIR/<name>,
continuing past failures. ViLBERT's presets are skipped (and `convert`
refuses them): they come from the authors' checkpoints, which are not in
`transformers` format, through `azk-convert vilbert` (`attention_zoo_keras.conversion.vilbert`).

Reading a `.bin` checkpoint needs PyTorch and verifying needs
`transformers` too; the commands that need them say which extra to
install (`pip install 'attention_zoo_keras[torch,conversion]'`).

Exit codes: 0 success; 1 a conversion or verification failed (parity above
the tolerance, a download or conversion error; with `--all`, any preset);
2 a usage error (unknown preset, missing `--class`, a directory that is not
a native preset, an `--out` directory that is not a preset, ...).
"""

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

from attention_zoo_keras.conversion import state_dict
from attention_zoo_keras.conversion import vilbert
from attention_zoo_keras.conversion.verifiers import TOLERANCE
from attention_zoo_keras.conversion.verifiers import NoVerifierError
from attention_zoo_keras.conversion.verifiers import unverifiable_reason
from attention_zoo_keras.conversion.verifiers import verifier_for
from attention_zoo_keras.hub.atomic import DirectoryNotReplaceableError
from attention_zoo_keras.hub.catalog import presets_markdown

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


# Families whose named presets are not converted from a `transformers`
# checkpoint, and how they are made instead.
CONVERTED_BY_THEIR_OWN_SCRIPT = {
    "vilbert": "its source is the native preset converted from the ViLBERT authors' checkpoint (not in "
    "transformers format): run azk-convert vilbert CHECKPOINT CONFIG DEST [--vocab VOCAB]",
}


class UsageError(Exception):
    """A command-line mistake: reported on stderr with exit code 2."""


class ParityError(Exception):
    """The converted preset differs from the reference above the tolerance."""

    def __init__(self, parity):
        self.parity = parity
        worst = max(parity["max_abs_difference"].values(), default=float("nan"))
        super().__init__(f"parity FAILED: max |ours - reference| {worst:.2e} > tolerance {parity['tolerance']:g}")


def _error(message):
    print(f"error: {message}", file=sys.stderr)


# --------------------------------------------------------------------- helpers


def _looks_like_source(text):
    from attention_zoo_keras.hub.source import HF_PREFIX
    from attention_zoo_keras.hub.source import PresetSource

    return text.startswith(HF_PREFIX) or PresetSource._looks_like_path(text)


def _resolve(preset_or_src, class_name):
    """`(handle, model class, catalog entry or None)` for `convert`."""
    import attention_zoo_keras as azk
    from attention_zoo_keras.hub.catalog import UnknownPresetError
    from attention_zoo_keras.hub.catalog import get_preset

    entry = None
    if not _looks_like_source(preset_or_src):
        try:
            entry = get_preset(preset_or_src)
        except UnknownPresetError as error:
            raise UsageError(str(error)) from error
        if entry["family"] in CONVERTED_BY_THEIR_OWN_SCRIPT:
            how = CONVERTED_BY_THEIR_OWN_SCRIPT[entry["family"]]
            raise UsageError(f"'{preset_or_src}' is not converted here: {how}.")
        class_name = class_name or entry["class_name"]
    elif class_name is None:
        raise UsageError(
            f"'{preset_or_src}' is a checkpoint source, not a named preset: pass --class to say which "
            "class to build (e.g. --class BertBackbone, --class GPTCausalLM, --class ViTImageClassifier, "
            "--class TransformerSeq2SeqLM)."
        )
    elif not preset_or_src.startswith("hf://") and not Path(preset_or_src).expanduser().is_dir():
        raise UsageError(f"source directory '{preset_or_src}' does not exist.")
    try:
        model_cls = azk.registration.registered_class(class_name, source="--class")
    except Exception as error:  # UnregisteredClassError: lists close names
        raise UsageError(str(error)) from error
    return preset_or_src, model_cls, entry


def _native_config(directory):
    """The `config.json` of a native preset directory, or a `UsageError`."""
    from attention_zoo_keras.hub.preset_format import is_native

    directory = Path(directory)
    path = directory / "config.json"
    if not directory.is_dir():
        raise UsageError(f"'{directory}' is not a directory.")
    if not path.is_file():
        raise UsageError(f"'{directory}' is not a native attention_zoo_keras preset: it has no config.json.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"'{path}' is not valid JSON: {error}") from error
    if not is_native(config):
        raise UsageError(
            f"'{directory}' is not a native attention_zoo_keras preset (its config.json was not written by "
            "this library; a transformers checkpoint is converted first: azk-convert convert)."
        )
    return config


def _family(model):
    """The family of a backbone, or of a task's backbone."""
    return getattr(model, "backbone", model).family


def _versions():
    import importlib.metadata

    import keras

    import attention_zoo_keras as azk

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

    Raises:
        UsageError: `directory` is no native preset, or `reference` is unknown.
        NoVerifierError: no verifier applies.
    """
    import keras

    from attention_zoo_keras.hub.catalog import UnknownPresetError
    from attention_zoo_keras.hub.preset_format import record_parity
    from attention_zoo_keras.hub.source import PresetFileError
    from attention_zoo_keras.hub.source import PresetSource
    from attention_zoo_keras.registration import registered_class

    config = _native_config(directory)
    try:
        source = PresetSource.of(reference)
    except (UnknownPresetError, PresetFileError) as error:
        raise UsageError(f"--reference: {error}") from error
    model_cls = registered_class(config["class_name"], source=f"config.json of '{directory}'")
    model = model_cls.from_preset(str(directory))
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


def _difference_lines(parity):
    """One line per output of a parity record: its max |ours - reference|."""
    tolerance = parity["tolerance"]
    return [
        f"  max |ours - reference| {name}: {value:.2e} (tolerance {tolerance:g})"
        for name, value in parity["max_abs_difference"].items()
    ]


def _print_parity(parity, out=None):
    out = out or sys.stdout
    status = "passed" if parity["passed"] else "FAILED"
    print(f"parity against {parity['reference']} ({parity['backend']}): {status}", file=out)
    for line in _difference_lines(parity):
        print(line, file=out)


def _save_converted(model, handle, entry, directory, echo):
    """Saves a converted model as a native preset in `directory`: a backbone
    with its family's preprocessor (so that its tasks can be built from the
    preset), and the source checkpoint recorded in the metadata and card."""
    from attention_zoo_keras.hub.preset_format import record_source

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

    Raises:
        ParityError: the converted model differs from the reference above
            the tolerance; `out` is left as it was.
        DirectoryNotReplaceableError: `out` is a directory that is neither
            empty nor a native preset; nothing in it is touched.
    """
    from attention_zoo_keras.hub.preset_format import staged_preset

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
                for line in _difference_lines(parity):
                    echo(line)
                if not parity["passed"]:
                    raise ParityError(parity)
                echo(f"parity against {parity['reference']}: passed")
    echo(f"saved {model_cls.__name__} from {handle} to {out}")
    return parity


# -------------------------------------------------------------------- commands


def _command_list(args):
    import attention_zoo_keras as azk

    presets = azk.list_presets(family=args.family)
    if not presets:
        raise UsageError(f"no presets of the family '{args.family}'.")
    if args.markdown:
        print(presets_markdown(args.family), end="")
        return EXIT_OK
    rows = [("name", "class", "family", "source", "verifier")]
    unverifiable = {}  # reason -> names
    for name, entry in sorted(presets.items()):
        reason = unverifiable_reason(entry)
        if reason is not None:
            unverifiable.setdefault(reason, []).append(name)
        rows.append((name, entry["class_name"], entry["family"], entry["source"], "no" if reason else "yes"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))
    for reason, names in unverifiable.items():
        print(f"\nnot verifiable: {', '.join(names)}: {reason}.")
    return EXIT_OK


def _command_convert(args):
    if args.all:
        if args.preset_or_src is not None or args.class_name is not None:
            raise UsageError("--all converts every named preset: give no PRESET_OR_SRC and no --class with it.")
        return _convert_all(args)
    if args.preset_or_src is None:
        raise UsageError("give a named preset or a source (PRESET_OR_SRC), or --all.")
    handle, model_cls, entry = _resolve(args.preset_or_src, args.class_name)
    try:
        convert_one(handle, model_cls, args.out, verify=not args.no_verify, entry=entry)
    except ParityError as error:
        _print_parity(error.parity, sys.stderr)
        _error(f"{error}; nothing was written to {args.out}.")
        return EXIT_FAILED
    return EXIT_OK


def _convert_all(args):
    import attention_zoo_keras as azk
    from attention_zoo_keras.registration import registered_class
    from tqdm.auto import tqdm

    presets = azk.list_presets()
    skipped = {name: CONVERTED_BY_THEIR_OWN_SCRIPT[entry["family"]] for name, entry in presets.items()
               if entry["family"] in CONVERTED_BY_THEIR_OWN_SCRIPT}
    failures = {}
    out = Path(args.out)
    progress = tqdm(sorted(set(presets) - set(skipped)), desc="converting", unit="preset", file=sys.stderr)
    for name in progress:
        progress.set_postfix_str(name)
        entry = presets[name]
        try:
            convert_one(
                name,
                registered_class(entry["class_name"], source=f"preset '{name}'"),
                out / name,
                verify=not args.no_verify,
                entry=entry,
                echo=tqdm.write,
            )
        except Exception as error:  # noqa: BLE001 - every failure is reported at the end
            failures[name] = f"{type(error).__name__}: {error}"
            tqdm.write(f"{name}: FAILED ({failures[name].splitlines()[0]})", file=sys.stderr)
    progress.close()
    attempted = len(presets) - len(skipped)
    print(f"converted {attempted - len(failures)} of {attempted} presets into {out}")
    for name, reason in sorted(skipped.items()):
        print(f"skipped {name}: {reason}")
    if failures:
        print(f"{len(failures)} failed:", file=sys.stderr)
        for name, reason in failures.items():
            print(f"  {name}: {reason}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _command_verify(args):
    try:
        parity = verify_preset(args.directory, args.reference)
    except NoVerifierError as error:
        raise UsageError(f"cannot verify '{args.directory}': {error}.") from error
    _print_parity(parity)
    if not parity["passed"]:
        _error(f"{ParityError(parity)}; recorded in {Path(args.directory) / 'metadata.json'}.")
        return EXIT_FAILED
    return EXIT_OK


def _command_publish(args):
    _native_config(args.directory)
    if not args.handle.startswith("hf://"):
        raise UsageError(f"'{args.handle}' is not a hub handle; expected hf://org/name.")
    metadata_path = Path(args.directory) / "metadata.json"
    metadata = json.loads(metadata_path.read_text(encoding="utf-8")) if metadata_path.is_file() else {}
    parity = metadata.get("parity")
    if parity is not None and not parity.get("passed") and not args.allow_failed_parity:
        raise UsageError(
            f"'{args.directory}' failed its parity check ({metadata_path}); fix it, or pass "
            "--allow-failed-parity to publish it anyway."
        )
    if parity is None:
        print(f"note: '{args.directory}' records no parity check (azk-convert verify).", file=sys.stderr)
    from attention_zoo_keras import upload_preset

    commit = upload_preset(args.handle, args.directory, revision=args.revision, private=args.private)
    where = args.handle + (f"@{args.revision}" if args.revision else "")
    print(f"published {args.directory} to {where} (commit {commit.oid})")
    return EXIT_OK


# ---------------------------------------------------------------------- parser


def build_parser():
    """The `azk-convert` argument parser, one subcommand per command."""
    parser = argparse.ArgumentParser(
        prog="azk-convert",
        description="Convert upstream checkpoints into native attention_zoo_keras presets, verify them "
        "against the reference implementation, and publish them.",
        epilog="Exit codes: 0 success, 1 a conversion or verification failed, 2 a usage error.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    listing = commands.add_parser(
        "list", help="list the named presets", description="Every named preset: class, family, source, and "
        "whether a verifier exists for it."
    )
    listing.add_argument("--family", help="only the presets of this family (bert, gpt, vit, ...)")
    listing.add_argument(
        "--markdown", action="store_true",
        help="a Markdown table with parameters and licenses (what docs/presets.md holds)",
    )
    listing.set_defaults(run=_command_list)

    convert = commands.add_parser(
        "convert",
        help="convert a named preset or a checkpoint into a native preset",
        description="Download a checkpoint, convert it with the library's converter, save it as a native "
        "preset, and verify it against the reference implementation (tolerance 1e-4, fp32).",
    )
    convert.add_argument(
        "preset_or_src", nargs="?", metavar="PRESET_OR_SRC",
        help="a named preset (see `list`), or hf://org/repo[@revision] or a local directory in "
        "transformers format (with --class)",
    )
    convert.add_argument("--class", dest="class_name", metavar="CLASS",
                         help="the class to build from a raw source, e.g. BertBackbone or GPTCausalLM "
                         "(named presets say it themselves)")
    convert.add_argument("--out", required=True, metavar="DIR",
                         help="where the native preset goes (with --all: DIR/<name> for each preset)")
    convert.add_argument("--no-verify", action="store_true", help="skip the comparison with the reference")
    convert.add_argument("--all", action="store_true",
                         help="convert every named preset, continuing past failures (exit 1 if any failed)")
    convert.set_defaults(run=_command_convert)

    verify = commands.add_parser(
        "verify",
        help="verify a native preset against the reference implementation",
        description="Run the native preset and the reference implementation (transformers) on the same "
        "random inputs; record max |ours - reference| per output, the tolerance, the backend and the versions "
        "in metadata.json ('parity') and the model card. Exit 1 above the tolerance.",
    )
    verify.add_argument("directory", metavar="DIR", help="a native preset directory")
    verify.add_argument("--reference", required=True, metavar="SRC",
                        help="the checkpoint it was converted from: hf://org/repo[@revision], a local "
                        "transformers directory, or a named preset")
    verify.set_defaults(run=_command_verify)

    publish = commands.add_parser(
        "publish",
        help="upload a native preset to the Hugging Face Hub",
        description="Upload a native preset directory to a hub repository (attention_zoo_keras.upload_preset).",
    )
    publish.add_argument("directory", metavar="DIR", help="a native preset directory")
    publish.add_argument("handle", metavar="HANDLE", help="hf://org/name")
    publish.add_argument("--revision", help="the branch to upload to (default: main)")
    publish.add_argument("--private", action="store_true", help="create the repository as private")
    publish.add_argument("--allow-failed-parity", action="store_true",
                         help="publish even if the preset's recorded parity check failed")
    publish.set_defaults(run=_command_publish)

    vilbert.add_command(commands)
    return parser


def main(argv=None):
    """Runs the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (UsageError, DirectoryNotReplaceableError) as error:
        _error(str(error))
        return EXIT_USAGE
    except ParityError as error:  # pragma: no cover - handled by the commands
        _error(str(error))
        return EXIT_FAILED
    except Exception as error:  # noqa: BLE001 - a failed download or conversion: say what, exit 1
        from attention_zoo_keras.hub.source import PresetFileError

        if not isinstance(error, (PresetFileError, ValueError, TypeError, OSError, ImportError)):
            raise
        _error(f"{type(error).__name__}: {error}")
        return EXIT_FAILED
