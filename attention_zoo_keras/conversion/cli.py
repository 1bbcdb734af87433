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
import json
import sys
from pathlib import Path

import attention_zoo_keras as azk
from attention_zoo_keras.conversion import vilbert
from attention_zoo_keras.conversion.command_arguments import CONVERTED_BY_THEIR_OWN_SCRIPT
from attention_zoo_keras.conversion.command_arguments import UsageError
from attention_zoo_keras.conversion.command_arguments import native_config
from attention_zoo_keras.conversion.command_arguments import resolve_conversion
from attention_zoo_keras.conversion.verified_conversion import ParityError
from attention_zoo_keras.conversion.verified_conversion import convert_one
from attention_zoo_keras.conversion.verified_conversion import difference_lines
from attention_zoo_keras.conversion.verified_conversion import verify_preset
from attention_zoo_keras.conversion.verifiers import NoVerifierError
from attention_zoo_keras.conversion.verifiers import unverifiable_reason
from attention_zoo_keras.hub.atomic import DirectoryNotReplaceableError
from attention_zoo_keras.hub.catalog import presets_markdown
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.registration import registered_class

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _error(message):
    print(f"error: {message}", file=sys.stderr)


def _print_parity(parity, out=None):
    out = out or sys.stdout
    status = "passed" if parity["passed"] else "FAILED"
    print(f"parity against {parity['reference']} ({parity['backend']}): {status}", file=out)
    for line in difference_lines(parity):
        print(line, file=out)


# -------------------------------------------------------------------- commands


def _command_list(args):
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
    handle, model_cls, entry = resolve_conversion(args.preset_or_src, args.class_name)
    try:
        convert_one(handle, model_cls, args.out, verify=not args.no_verify, entry=entry)
    except ParityError as error:
        _print_parity(error.parity, sys.stderr)
        _error(f"{error}; nothing was written to {args.out}.")
        return EXIT_FAILED
    return EXIT_OK


def _convert_all(args):
    from tqdm.auto import tqdm  # a dependency of huggingface_hub's, not ours

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
    native_config(args.directory)
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
        if not isinstance(error, (PresetFileError, ValueError, TypeError, OSError, ImportError)):
            raise
        _error(f"{type(error).__name__}: {error}")
        return EXIT_FAILED

