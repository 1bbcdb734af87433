"""Convert a checkpoint of the ViLBERT authors (Lu et al., 2019;
facebookresearch/vilbert-multi-task) into a native attention_zoo_keras
preset: a ViLBERT task with its head, its preprocessor and tokenizer.

    python conversion/convert_vilbert.py CHECKPOINT CONFIG VOCAB DEST \\
        --task {pretrainer,vqa,gqa,retrieval,region_scorer} \\
        [--task-id N] [--sequence-length N] [--max-regions N]

CHECKPOINT is the authors' `.bin` (a torch `state_dict`, read strictly with
`torch.load(map_location="cpu", weights_only=True)`, which refuses to
unpickle anything but tensors) or a `.safetensors` file with the same names;
CONFIG is their `BertConfig` JSON (`config/bert_base_6layer_6conect.json`);
VOCAB is bert-base-uncased's WordPiece `vocab.txt` (one token a line,
lower-cased) or a `tokenizer.json`; DEST receives the native preset.

The authors' checkpoints:

- https://dl.fbaipublicfiles.com/vilbert-multi-task/pretrained_model.bin:
  Conceptual Captions pretraining, `BertForMultiModalPreTraining.state_dict()`
  (`bert.*` and the pretraining heads `cls.*`) → `--task pretrainer`.
- https://dl.fbaipublicfiles.com/vilbert-multi-task/multi_task_model.bin:
  the 12-in-1 multi-task model, `VILBertForVLTasks.state_dict()` (`bert.*`,
  `cls.*`, `vil_prediction.*` (VQA, 3129 answers), `vil_prediction_gqa.*`
  (GQA, 1533), `vil_logit.*` (retrieval), `vision_logit.*` (referring
  expressions), `vil_binary_prediction.*`, `vil_tri_prediction.*`,
  `linguisic_logit.*`). It was trained with task-specific tokens, so it
  holds `bert.embeddings.task_embeddings.weight` (20 tasks); the config
  should then say `"task_specific_tokens": true` (if the config does not
  say, the checkpoint decides) → `--task vqa`, `gqa`, `retrieval` or
  `region_scorer`.

Both use `bert_base_6layer_6conect.json`: vocabulary 30522, 12 text layers
of 768, 6 visual layers of 1024 on 2048-d region features (`v_target_size`
1601 detector classes), 6 co-attention layers of 1024 with 8 heads
(`v_biattention_id` [0..5], `t_biattention_id` [6..11]).

Keys may carry DataParallel's `module.` prefix; it is stripped.
`cls.predictions.decoder.weight` is tied to the word embeddings (checked:
they must be equal); the co-attention layers' `biOutput.q_dense1/2` are
never used by the authors' code and are ignored. Every other tensor must be
consumed: heads the chosen task does not use (`vil_binary_prediction`,
`vil_tri_prediction`, `linguisic_logit`, the other tasks' heads) are listed
as skipped; any other leftover key is an error.

Each task gets the authors' text and region lengths and task id by default
(the task id only where the checkpoint has task tokens):

    task            head                 sequence_length  max_regions  task_id
    pretrainer      cls.*                36               37           -
    vqa             vil_prediction       23               101          1
    gqa             vil_prediction_gqa   26               101          15
    retrieval       vil_logit            30               101          8   (Flickr30k)
    region_scorer   vision_logit         20               101          11  (RefCOCO)

No reference implementation can be installed here, so verification checks
the tied decoder, that every tensor was consumed, and that the preset as
written (to a temporary directory beside DEST) loads back with
`from_preset` and gives the in-memory model's outputs on random inputs;
only then is it moved to DEST. On any failure nothing is written.
"""

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Callable
from typing import NamedTuple
from typing import Optional

import keras
import numpy as np

from attention_zoo_keras.hub.preset_format import staged_preset
from attention_zoo_keras.hub.preset_format import record_source
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.models.bert import BertTokenizer
from attention_zoo_keras.models.vilbert import ViLBERTBackbone
from attention_zoo_keras.models.vilbert import ViLBERTImageTextRetriever
from attention_zoo_keras.models.vilbert import ViLBERTPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTRetrievalPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTPretrainer
from attention_zoo_keras.models.vilbert import ViLBERTPretrainerPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTRegionScorer
from attention_zoo_keras.models.vilbert import ViLBERTVisualQuestionAnswerer
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_arrays
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_backbone_config
from attention_zoo_keras.models.vilbert.vilbert_image_text_retriever import vilbert_retrieval_head_arrays
from attention_zoo_keras.models.vilbert.vilbert_pretrainer import vilbert_pretraining_head_arrays
from attention_zoo_keras.models.vilbert.vilbert_region_scorer import vilbert_region_scorer_head_arrays
from attention_zoo_keras.models.vilbert.vilbert_visual_question_answerer import vilbert_vqa_head_arrays


class Conversion(NamedTuple):
    """What `--task` converts: the task class and its preprocessor's, the
    checkpoint's head (prefix and mapping), and the authors' lengths and task id."""

    task_cls: type
    preprocessor_cls: type
    head: str
    head_arrays: Callable
    sequence_length: int
    max_regions: int
    task_id: Optional[int]


TASKS = {
    "pretrainer": Conversion(
        ViLBERTPretrainer, ViLBERTPretrainerPreprocessor, "cls", vilbert_pretraining_head_arrays, 36, 37, None
    ),
    "vqa": Conversion(
        ViLBERTVisualQuestionAnswerer, ViLBERTPreprocessor, "vil_prediction",
        functools.partial(vilbert_vqa_head_arrays, head="vil_prediction"), 23, 101, 1,
    ),
    "gqa": Conversion(
        ViLBERTVisualQuestionAnswerer, ViLBERTPreprocessor, "vil_prediction_gqa",
        functools.partial(vilbert_vqa_head_arrays, head="vil_prediction_gqa"), 26, 101, 15,
    ),
    "retrieval": Conversion(
        ViLBERTImageTextRetriever, ViLBERTRetrievalPreprocessor, "vil_logit", vilbert_retrieval_head_arrays, 30, 101, 8
    ),
    "region_scorer": Conversion(
        ViLBERTRegionScorer, ViLBERTPreprocessor, "vision_logit", vilbert_region_scorer_head_arrays, 20, 101, 11
    ),
}
# The heads of the authors' `BertForMultiModalPreTraining` / `VILBertForVLTasks`;
# those the chosen task does not convert are knowingly skipped.
KNOWN_HEADS = (
    "cls", "vil_prediction", "vil_prediction_gqa", "vil_logit", "vision_logit",
    "vil_binary_prediction", "vil_tri_prediction", "linguisic_logit",
)
TIED_DECODER = "cls.predictions.decoder.weight"
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
TASK_EMBEDDINGS = "bert.embeddings.task_embeddings.weight"
UNUSED_SUFFIXES = (".biOutput.q_dense1.weight", ".biOutput.q_dense1.bias",
                   ".biOutput.q_dense2.weight", ".biOutput.q_dense2.bias")
VERIFY_SEED = 1234
TOLERANCE = 1e-6
LICENSE = "mit"  # facebookresearch/vilbert-multi-task


class ConversionError(Exception):
    """The checkpoint cannot be converted faithfully; nothing is saved."""


class TrackedStateDict(dict):
    """A `{name: array}` dict that remembers which names were read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read = set()

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.read.add(key)
        return value


def read_checkpoint(path):
    """`{name: numpy array}` of the authors' checkpoint, float tensors as
    float32, DataParallel's `module.` prefix stripped."""
    import torch

    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path), device="cpu")
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConversionError(f"'{path}' does not hold a state_dict of tensors.")
    arrays = {}
    for name, tensor in state.items():
        name = name[len("module."):] if name.startswith("module.") else name
        tensor = tensor.detach().cpu()
        arrays[name] = tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
    return arrays


def read_tokenizer(path):
    """A `BertTokenizer` from a `vocab.txt` (lower-cased, as bert-base-uncased)
    or a `tokenizer.json`."""
    path = Path(path)
    if path.suffix == ".json":
        return BertTokenizer.from_file(path)
    return BertTokenizer.from_vocabulary(str(path), lowercase=True)


def check_tied_decoder(state_dict):
    """The masked-LM decoder must be the word embeddings (the authors tie them)."""
    if TIED_DECODER not in state_dict:
        return
    decoder, embeddings = state_dict[TIED_DECODER], state_dict[WORD_EMBEDDINGS]
    if decoder.shape != embeddings.shape or not np.array_equal(decoder, embeddings):
        raise ConversionError(
            f"'{TIED_DECODER}' differs from '{WORD_EMBEDDINGS}': the authors tie them, and this port reads "
            "the decoder from the word embeddings, so an untied decoder cannot be converted."
        )


def leftover_keys(state_dict, converted_head):
    """`(skipped, unexpected)`: the tensors no mapping read, split into other
    known heads (skipped on purpose) and anything else (an error)."""
    skipped, unexpected = [], []
    for name in sorted(set(state_dict) - state_dict.read):
        unused = name.startswith("bert.encoder.c_layer.") and name.endswith(UNUSED_SUFFIXES)
        if name == TIED_DECODER or unused:
            continue
        head = name.split(".", 1)[0]
        if head in KNOWN_HEADS and head != converted_head:
            skipped.append(name)
        else:
            unexpected.append(name)
    return skipped, unexpected


def build(task, state_dict, authors_config, tokenizer, task_id=None, sequence_length=None, max_regions=None):
    """The converted task (weights assigned, preprocessor attached) and the
    names of the skipped heads."""
    task_cls, preprocessor_cls, head, head_arrays, default_length, default_regions, default_task_id = TASKS[task]
    authors_config = dict(authors_config)
    if "task_specific_tokens" not in authors_config:
        authors_config["task_specific_tokens"] = TASK_EMBEDDINGS in state_dict
    if bool(authors_config["task_specific_tokens"]) != (TASK_EMBEDDINGS in state_dict):
        raise ConversionError(
            f"The config says task_specific_tokens={authors_config['task_specific_tokens']!r} but the checkpoint "
            f"{'has' if TASK_EMBEDDINGS in state_dict else 'has no'} '{TASK_EMBEDDINGS}' (the multi-task model "
            "has task tokens; leave the key out of the config to follow the checkpoint)."
        )
    if WORD_EMBEDDINGS not in state_dict:
        raise ConversionError(f"The checkpoint has no '{WORD_EMBEDDINGS}'; it is not a ViLBERT checkpoint.")
    check_tied_decoder(state_dict)
    try:
        backbone_config = vilbert_backbone_config(authors_config)
        arrays = {**vilbert_arrays(state_dict, authors_config), **head_arrays(state_dict)}
    except (KeyError, ValueError) as error:
        raise ConversionError(f"The checkpoint does not fit the config: {error}") from error
    if tokenizer.vocabulary_size > backbone_config["vocabulary_size"]:
        raise ConversionError(
            f"The vocabulary has {tokenizer.vocabulary_size} tokens but the model only "
            f"{backbone_config['vocabulary_size']} embeddings."
        )

    has_task_tokens = backbone_config["num_task_tokens"] > 0
    if task_id is None and has_task_tokens and preprocessor_cls is not ViLBERTPretrainerPreprocessor:
        task_id = default_task_id
    if task_id is not None and not has_task_tokens:
        raise ConversionError("--task-id needs a checkpoint with task tokens (task_embeddings); this one has none.")
    if task_id is not None and not 0 <= task_id < backbone_config["num_task_tokens"]:
        raise ConversionError(f"--task-id must be in [0, {backbone_config['num_task_tokens']}); got {task_id}.")

    task_arguments = {}
    fusion = authors_config.get("fusion_method", authors_config.get("pooling_method", "mul"))
    if task_cls is not ViLBERTRegionScorer:
        task_arguments["fusion"] = fusion
    if task_cls is ViLBERTVisualQuestionAnswerer:
        task_arguments["num_answers"] = int(arrays["vqa_logits/bias"].shape[0])
    if task_cls is ViLBERTPretrainer:
        task_arguments["num_region_classes"] = int(arrays["region_logits/bias"].shape[0])

    preprocessor_arguments = {
        "sequence_length": sequence_length or default_length,
        "max_regions": max_regions or default_regions,
    }
    if preprocessor_cls is ViLBERTPretrainerPreprocessor:
        if task_id is not None:
            raise ConversionError("--task-id: the pretraining preprocessor adds no task ids.")
        if has_task_tokens:
            raise ConversionError(
                "--task pretrainer: this checkpoint has task tokens (the multi-task model); ViLBERTPretrainer "
                "takes a checkpoint without them (pretrained_model.bin)."
            )
    else:
        preprocessor_arguments["task_id"] = task_id
    preprocessor = preprocessor_cls(tokenizer, **preprocessor_arguments)

    backbone = ViLBERTBackbone(**backbone_config)
    model = task_cls(backbone, preprocessor=preprocessor, **task_arguments)
    variables = variables_by_key(model)
    missing = sorted(set(variables) - set(arrays))
    extra = sorted(set(arrays) - set(variables))
    wrong = sorted(k for k in set(variables) & set(arrays) if tuple(variables[k].shape) != tuple(arrays[k].shape))
    if missing or extra or wrong:
        raise ConversionError(
            f"The converted arrays do not fit {task_cls.__name__}: missing {missing}, unexpected {extra}, "
            f"wrong shapes {[(k, tuple(arrays[k].shape), tuple(variables[k].shape)) for k in wrong]}."
        )
    model.assign_arrays(arrays, "the authors' ViLBERT checkpoint")

    skipped, unexpected = leftover_keys(state_dict, head)
    if unexpected:
        raise ConversionError(
            f"{len(unexpected)} tensors of the checkpoint were not converted: {', '.join(unexpected)}."
        )
    return model, skipped


def random_inputs(model, seed=VERIFY_SEED, batch=2, regions=5):
    """Random feature inputs for `model` (a candidates axis for the retriever)."""
    backbone = model.backbone
    rng = np.random.default_rng(seed)
    length = min(model.preprocessor.sequence_length, backbone.max_sequence_length)
    regions = min(regions, model.preprocessor.max_regions)
    token_ids = rng.integers(0, backbone.vocabulary_size, size=(batch, length)).astype("int32")
    padding_mask = np.ones((batch, length), "int32")
    padding_mask[-1, length // 2:] = 0
    region_mask = np.ones((batch, regions), "int32")
    region_mask[-1, regions - 1:] = 0
    boxes = np.sort(rng.uniform(size=(batch, regions, 2, 2)), axis=2).reshape(batch, regions, 4)[..., [0, 2, 1, 3]]
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    x = {
        "token_ids": token_ids,
        "segment_ids": np.zeros_like(token_ids),
        "padding_mask": padding_mask,
        "region_features": rng.normal(size=(batch, regions, backbone.region_feature_dim)).astype("float32"),
        "region_boxes": np.concatenate([boxes, area[..., None]], axis=-1).astype("float32"),
        "region_mask": region_mask,
    }
    if backbone.num_task_tokens:
        x["task_ids"] = rng.integers(0, backbone.num_task_tokens, size=(batch, 1)).astype("int32")
    if isinstance(model, ViLBERTPretrainer):
        x["mask_positions"] = np.tile(np.arange(min(3, length), dtype="int32"), (batch, 1))
    if isinstance(model, ViLBERTImageTextRetriever):
        x = {name: value[None] for name, value in x.items()}  # one query, `batch` candidates
    return x


def outputs_of(model, x):
    """The model's outputs as `{name: numpy array}`."""
    outputs = model(x, training=False)
    if not isinstance(outputs, dict):
        outputs = {"output": outputs}
    return {name: keras.ops.convert_to_numpy(value) for name, value in outputs.items()}


def verify(model, directory):
    """Max |in-memory − reloaded from `directory`| over the outputs on random
    inputs; raises `ConversionError` if the preset does not load back as it was."""
    reloaded = type(model).from_preset(str(directory))
    # ViLBERTImageTextRetriever names no preprocessor class, so load it by itself.
    preprocessor = type(model.preprocessor).from_preset(str(directory))
    for name in ("sequence_length", "max_regions", "task_id"):
        if getattr(preprocessor, name, None) != getattr(model.preprocessor, name, None):
            raise ConversionError(f"The reloaded preprocessor's {name} differs from the converted one's.")
    text = ["a man riding a horse on a beach"]
    if preprocessor.tokenizer.encode(text) != model.preprocessor.tokenizer.encode(text):
        raise ConversionError("The reloaded tokenizer encodes differently from the converted one.")
    x = random_inputs(model)
    expected, actual = outputs_of(model, x), outputs_of(reloaded, x)
    if set(expected) != set(actual):
        raise ConversionError(f"The reloaded model's outputs {sorted(actual)} differ from {sorted(expected)}.")
    difference = 0.0
    for name, value in expected.items():
        if not np.all(np.isfinite(value)):
            raise ConversionError(f"The converted model's '{name}' output is not finite on random inputs.")
        difference = max(difference, float(np.max(np.abs(value - actual[name]))))
    return difference


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="the authors' .bin (or .safetensors) state_dict")
    parser.add_argument("config", help="the authors' BertConfig JSON (bert_base_6layer_6conect.json)")
    parser.add_argument("vocab", help="WordPiece vocab.txt (lower-cased) or tokenizer.json")
    parser.add_argument("dest", help="directory that receives the native preset")
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--task-id", type=int, default=None, help="task token id (default: the authors' for the task)")
    parser.add_argument("--sequence-length", type=int, default=None, help="text length (default: the authors')")
    parser.add_argument("--max-regions", type=int, default=None, help="region slots (default: the authors')")
    args = parser.parse_args(argv)

    try:
        authors_config = json.loads(Path(args.config).read_text())
        state_dict = TrackedStateDict(read_checkpoint(args.checkpoint))
        model, skipped = build(
            args.task, state_dict, authors_config, read_tokenizer(args.vocab),
            task_id=args.task_id, sequence_length=args.sequence_length, max_regions=args.max_regions,
        )
        if skipped:
            heads = sorted({name.split(".", 1)[0] for name in skipped})
            print(f"skipped {len(skipped)} tensors of heads this task does not use: {', '.join(heads)}")
        with staged_preset(args.dest) as staging:
            model.save_to_preset(staging)
            record_source(staging, f"the authors' {Path(args.checkpoint).name} (vilbert-multi-task)", LICENSE)
            difference = verify(model, staging)
            print(f"max |converted - reloaded from the preset| on random inputs: {difference:.2e}")
            if difference > TOLERANCE:
                raise ConversionError(f"the reloaded preset differs by {difference:.2e} > {TOLERANCE}")
    except ConversionError as error:
        print(f"FAILED: {error} Nothing saved.", file=sys.stderr)
        return 1
    preprocessor = model.preprocessor
    print(
        f"saved {type(model).__name__} ({model.count_params():,} parameters; sequence_length "
        f"{preprocessor.sequence_length}, max_regions {preprocessor.max_regions}, task_id "
        f"{getattr(preprocessor, 'task_id', None)}) to {args.dest}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
