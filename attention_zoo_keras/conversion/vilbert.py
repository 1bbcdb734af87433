"""Convert a checkpoint of the ViLBERT authors (Lu et al., 2019;
facebookresearch/vilbert-multi-task) into one native attention_zoo_keras
preset that serves every head it holds, with a preprocessor and tokenizer
when a vocabulary is given.

    azk-convert vilbert CHECKPOINT CONFIG DEST [--vocab VOCAB] \\
        [--task {pretrainer,vqa,gqa,retrieval,region_scorer} ...] \\
        [--task-id N] [--sequence-length N] [--max-regions N]

By default every head of the checkpoint is converted onto one shared
backbone and saved with `save_preset_with_heads`: `<Task>.from_preset(DEST)`
then builds any of them. A preset holds one head per task class, so GQA
(which shares `ViLBERTVisualQuestionAnswerer` with VQA) converts by itself
with `--task gqa`; the multi-task model's pretraining heads are left out
(`ViLBERTPretrainer` takes no task tokens). One `--task` writes that task's
own preset, as before; several write those heads only.

CHECKPOINT is the authors' `.bin` (a torch `state_dict`, read strictly with
`torch.load(map_location="cpu", weights_only=True)`, which refuses to
unpickle anything but tensors; needs PyTorch) or a `.safetensors` file with
the same names; CONFIG is their `BertConfig` JSON
(`config/bert_base_6layer_6conect.json`); DEST receives the native preset
(it must be missing, empty, or a native preset). VOCAB is bert-base-uncased's
WordPiece `vocab.txt` (one token a line, lower-cased) or a `tokenizer.json`;
without it the preset has no preprocessor and takes token ids and region
features (`from_preset(DEST, preprocessor=None)`).

The checkpoints, and which head becomes which task with which lengths and
task id: `attention_zoo_keras.conversion.vilbert_conversion`. Keys may carry
DataParallel's `module.` prefix; it is stripped.

No reference implementation can be installed here, so verification checks
the tied decoder, that every tensor was consumed, and that the preset as
written (to a temporary directory beside DEST) loads back with
`from_preset` and gives the in-memory model's outputs on random inputs;
only then is it moved to DEST. On any failure nothing is written.
"""

import json
import sys
from pathlib import Path

import numpy as np

from attention_zoo_keras.conversion.state_dict import load_torch_file
from attention_zoo_keras.conversion.vilbert_conversion import TASKS
from attention_zoo_keras.conversion.vilbert_conversion import ConversionError
from attention_zoo_keras.conversion.vilbert_conversion import build
from attention_zoo_keras.conversion.vilbert_conversion import choose_tasks
from attention_zoo_keras.conversion.vilbert_verification import TOLERANCE
from attention_zoo_keras.conversion.vilbert_verification import verify
from attention_zoo_keras.hub.preset_format import record_source
from attention_zoo_keras.hub.preset_format import save_preset_with_heads
from attention_zoo_keras.hub.preset_format import staged_preset
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.weights import TrackedArrays
from attention_zoo_keras.models.bert import BertTokenizer

LICENSE = "mit"  # facebookresearch/vilbert-multi-task


def read_checkpoint(path):
    """`{name: numpy array}` of the authors' checkpoint (`.safetensors`, or
    a `.bin` read by `load_torch_file`), float tensors as float32,
    DataParallel's `module.` prefix stripped."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        state = {
            name: array.astype("float32") if np.issubdtype(array.dtype, np.floating) else array
            for name, array in load_file(str(path)).items()
        }
    else:
        state = load_torch_file(path)
    return {name[len("module."):] if name.startswith("module.") else name: array for name, array in state.items()}


def read_authors_config(path):
    """The authors' `BertConfig` JSON as a dict; a `ConversionError` names
    the file if it is not a JSON object."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConversionError(f"The config '{path}' is not valid JSON: {error}.") from error
    if not isinstance(config, dict):
        raise ConversionError(f"The config '{path}' holds a JSON {type(config).__name__}, not the authors' BertConfig object.")
    return config


def read_tokenizer(path):
    """A `BertTokenizer` from a `vocab.txt` (lower-cased, as bert-base-uncased)
    or a `tokenizer.json`."""
    path = Path(path)
    if path.suffix == ".json":
        return BertTokenizer.from_file(path)
    return BertTokenizer.from_vocabulary(str(path), lowercase=True)


def add_command(commands):
    """Adds the `vilbert` command to the `azk-convert` subparsers `commands`."""
    parser = commands.add_parser(
        "vilbert",
        help="convert a checkpoint of the ViLBERT authors into a native preset",
        description="Convert a checkpoint of the ViLBERT authors (facebookresearch/vilbert-multi-task: "
        "pretrained_model.bin, multi_task_model.bin) into one native preset that serves every head it holds "
        "(<Task>.from_preset), and check that it loads back unchanged. Without --vocab the preset has no "
        "tokenizer and takes token ids.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="the authors' .bin (or .safetensors) state_dict")
    parser.add_argument("config", metavar="CONFIG",
                        help="the authors' BertConfig JSON (bert_base_6layer_6conect.json)")
    parser.add_argument("dest", metavar="DEST", help="the directory that receives the native preset")
    parser.add_argument("--vocab", metavar="VOCAB",
                        help="WordPiece vocab.txt (lower-cased) or tokenizer.json; without it the preset has no "
                        "preprocessor and takes token ids")
    parser.add_argument("--task", choices=sorted(TASKS), action="append",
                        help="convert this head only (repeat for several); default: every head the checkpoint "
                        "holds, one per task class, into one preset")
    parser.add_argument("--task-id", type=int, default=None, help="task token id (default: the authors' for the task)")
    parser.add_argument("--sequence-length", type=int, default=None, help="text length (default: the authors')")
    parser.add_argument("--max-regions", type=int, default=None, help="region slots (default: the authors')")
    parser.set_defaults(run=run)


def run(args):
    """Runs `azk-convert vilbert` with its parsed `args`; returns the exit
    code (1 on a checkpoint that cannot be converted, nothing saved)."""
    try:
        with staged_preset(args.dest) as staging:  # refuses a DEST that is not ours before any work
            state_dict = TrackedArrays(read_checkpoint(args.checkpoint))
            tokenizer = None if args.vocab is None else read_tokenizer(args.vocab)
            tasks, notes = choose_tasks(args.task, state_dict)
            models, preprocessor, skipped = build(
                tasks, state_dict, read_authors_config(args.config), tokenizer,
                task_id=args.task_id, sequence_length=args.sequence_length, max_regions=args.max_regions,
            )
            for note in notes:
                print(f"note: {note}")
            if skipped:
                heads = sorted({name.split(".", 1)[0] for name in skipped})
                print(f"skipped {len(skipped)} tensors of heads not converted: {', '.join(heads)}")
            head_task_ids = _head_task_ids(models, tasks, preprocessor) if len(models) > 1 else {}
            if len(models) == 1:
                models[0].save_to_preset(staging)
            else:
                save_preset_with_heads(
                    models[0].backbone, models, staging, preprocessor=preprocessor,
                    head_preprocessor_settings=head_task_ids,
                )
            record_source(staging, f"the authors' {Path(args.checkpoint).name} (vilbert-multi-task)", LICENSE)
            difference = verify(models, staging, preprocessor)
            print(f"max |converted - reloaded from the preset| on random inputs: {difference:.2e}")
            if difference > TOLERANCE:
                raise ConversionError(f"the reloaded preset differs by {difference:.2e} > {TOLERANCE}")
    except (ConversionError, PresetFileError) as error:
        print(f"FAILED: {error} Nothing saved.", file=sys.stderr)
        return 1
    _report(models, preprocessor, head_task_ids, args.dest)
    return 0


def _head_task_ids(models, tasks, preprocessor):
    """`{task class name: {"task_id": the authors' id}}` for the heads of a
    multi-task checkpoint whose shared preprocessor has no `--task-id`: each
    head then loads with the task id it was trained with."""
    if preprocessor is None or preprocessor.task_id is not None or not models[0].backbone.num_task_tokens:
        return {}
    return {type(model).__name__: {"task_id": TASKS[task].task_id} for model, task in zip(models, tasks)}


def _report(models, preprocessor, head_task_ids, dest):
    """Prints what was saved and how each task loads from it
    (`head_task_ids` as saved, see `_head_task_ids`)."""
    names = [type(model).__name__ for model in models]
    if len(models) == 1:
        print(f"saved {names[0]} ({models[0].count_params():,} parameters) to {dest}")
    else:
        backbone = models[0].backbone
        print(f"saved {type(backbone).__name__} ({backbone.count_params():,} parameters) with the heads of "
              f"{', '.join(names)} to {dest}: each loads with <Task>.from_preset")
    if preprocessor is None:
        print(f"no tokenizer (no --vocab): load with {names[0]}.from_preset(DEST, preprocessor=None) and pass "
              "token ids and region features")
        return
    print(f"preprocessor: {type(preprocessor).__name__} (sequence_length {preprocessor.sequence_length}, "
          f"max_regions {preprocessor.max_regions}, task_id {getattr(preprocessor, 'task_id', None)})")
    if head_task_ids:
        ids = ", ".join(f"{name} {settings['task_id']}" for name, settings in head_task_ids.items())
        print(f"each head loads with the task id it was trained with ({ids})")
