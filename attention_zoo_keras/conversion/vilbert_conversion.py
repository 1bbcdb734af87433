"""The ViLBERT authors' checkpoint (Lu et al., 2019;
facebookresearch/vilbert-multi-task) converted onto one `ViLBERTBackbone`
with the task heads chosen (`build`), each checked to be read faithfully.

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
  say, the checkpoint decides) → the VQA, retrieval and region-scorer heads
  (GQA with `--task gqa`).

Both use `bert_base_6layer_6conect.json`: vocabulary 30522, 12 text layers
of 768, 6 visual layers of 1024 on 2048-d region features (`v_target_size`
1601 detector classes), 6 co-attention layers of 1024 with 8 heads
(`v_biattention_id` [0..5], `t_biattention_id` [6..11]).

`cls.predictions.decoder.weight` is tied to the word embeddings (checked:
they must be equal); the co-attention layers' `biOutput.q_dense1/2` are
never used by the authors' code and are ignored. Every other tensor must be
consumed: heads not converted (`vil_binary_prediction`,
`vil_tri_prediction`, `linguisic_logit`, heads not chosen) are listed as
skipped; any other leftover key is an error.

A one-task preset's preprocessor gets the authors' text and region lengths
and task id by default (the task id only where the checkpoint has task
tokens); a preset of several heads gets a `ViLBERTPreprocessor` with the
longest of their lengths and no task id unless `--task-id` is given (each
head was trained with its own; the command prints them):

    task            head                 sequence_length  max_regions  task_id
    pretrainer      cls.*                36               37           -
    vqa             vil_prediction       23               101          1
    gqa             vil_prediction_gqa   26               101          15
    retrieval       vil_logit            30               101          8   (Flickr30k)
    region_scorer   vision_logit         20               101          11  (RefCOCO)
"""

import functools
from typing import Callable
from typing import NamedTuple
from typing import Optional

import numpy as np

from attention_zoo_keras.hub.weights import assign_weights
from attention_zoo_keras.hub.weights import variables_by_key
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
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_pretraining_head_arrays
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_region_scorer_head_arrays
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_retrieval_head_arrays
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_vqa_head_arrays


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


class ConversionError(Exception):
    """The checkpoint cannot be converted faithfully; nothing is saved."""



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


def leftover_keys(state_dict, converted_heads):
    """`(skipped, unexpected)`: the tensors no mapping read, split into the
    other known heads (skipped on purpose) and anything else (an error)."""
    skipped, unexpected = [], []
    for name in sorted(set(state_dict) - state_dict.read):
        unused = name.startswith("bert.encoder.c_layer.") and name.endswith(UNUSED_SUFFIXES)
        if name == TIED_DECODER or unused:
            continue
        head = name.split(".", 1)[0]
        if head in KNOWN_HEADS and head not in converted_heads:
            skipped.append(name)
        else:
            unexpected.append(name)
    return skipped, unexpected


def choose_tasks(requested, state_dict):
    """`(tasks, notes)`: the `TASKS` names to convert and, in words, the
    heads of the checkpoint left out and why.

    By default every head the checkpoint holds, one per task class: GQA
    shares `ViLBERTVisualQuestionAnswerer` with VQA (a preset holds one head
    per class), and the pretraining heads of the multi-task model do not fit
    `ViLBERTPretrainer`, which takes no task tokens.
    """
    if requested:
        tasks = list(dict.fromkeys(requested))
        classes = [TASKS[task].task_cls for task in tasks]
        shared = sorted({cls.__name__ for cls in classes if classes.count(cls) > 1})
        if shared:
            raise ConversionError(
                f"--task {' and '.join(t for t in tasks if TASKS[t].task_cls.__name__ in shared)} are heads of one "
                f"class ({', '.join(shared)}); a preset holds one head per task class: convert them one at a time."
            )
        return tasks, []
    present = {name.split(".", 1)[0] for name in state_dict}
    tasks, notes, classes = [], [], set()
    for task, conversion in TASKS.items():
        if conversion.head not in present:
            continue
        if conversion.task_cls in classes:
            notes.append(f"the {task} head ({conversion.head}) shares {conversion.task_cls.__name__} with another "
                         f"head converted here; convert it by itself with --task {task}")
        elif task == "pretrainer" and TASK_EMBEDDINGS in state_dict:
            notes.append("the pretraining heads (cls) are not converted: ViLBERTPretrainer takes a checkpoint "
                         "without task tokens (pretrained_model.bin)")
        else:
            tasks.append(task)
            classes.add(conversion.task_cls)
    if not tasks:
        raise ConversionError(
            f"The checkpoint holds none of the heads this port converts ({', '.join(c.head for c in TASKS.values())})."
        )
    return tasks, notes


def _checked_task_id(task_id, num_task_tokens):
    if task_id is not None and not num_task_tokens:
        raise ConversionError("--task-id needs a checkpoint with task tokens (task_embeddings); this one has none.")
    if task_id is not None and not 0 <= task_id < num_task_tokens:
        raise ConversionError(f"--task-id must be in [0, {num_task_tokens}); got {task_id}.")
    return task_id


def _backbone_parts(state_dict, authors_config):
    """`(authors config, ViLBERTBackbone arguments, its arrays)`, with the
    checks every conversion shares (task tokens, embeddings, tied decoder)."""
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
        return authors_config, vilbert_backbone_config(authors_config), vilbert_arrays(state_dict, authors_config)
    except (KeyError, ValueError) as error:
        raise ConversionError(f"The checkpoint does not fit the config: {error}") from error


def _task(task, backbone, backbone_arrays, state_dict, authors_config, preprocessor=None):
    """The task `task` on `backbone` (with `preprocessor`), its head's
    weights assigned."""
    conversion = TASKS[task]
    if conversion.task_cls is ViLBERTPretrainer and backbone.num_task_tokens:
        raise ConversionError(
            "--task pretrainer: this checkpoint has task tokens (the multi-task model); ViLBERTPretrainer "
            "takes a checkpoint without them (pretrained_model.bin)."
        )
    try:
        head_arrays = conversion.head_arrays(state_dict)
    except KeyError as error:
        raise ConversionError(f"The checkpoint does not fit the config: {error}") from error
    arguments = {}
    if conversion.task_cls is not ViLBERTRegionScorer:
        arguments["fusion"] = authors_config.get("fusion_method", authors_config.get("pooling_method", "mul"))
    if conversion.task_cls is ViLBERTVisualQuestionAnswerer:
        arguments["num_answers"] = int(head_arrays["vqa_logits/bias"].shape[0])
    if conversion.task_cls is ViLBERTPretrainer:
        arguments["num_region_classes"] = int(head_arrays["region_logits/bias"].shape[0])
    model = conversion.task_cls(backbone, preprocessor=preprocessor, **arguments)
    arrays = {**backbone_arrays, **head_arrays}
    variables = variables_by_key(model)
    missing = sorted(set(variables) - set(arrays))
    extra = sorted(set(arrays) - set(variables))
    wrong = sorted(k for k in set(variables) & set(arrays) if tuple(variables[k].shape) != tuple(arrays[k].shape))
    if missing or extra or wrong:
        raise ConversionError(
            f"The converted arrays do not fit {conversion.task_cls.__name__}: missing {missing}, unexpected {extra}, "
            f"wrong shapes {[(k, tuple(arrays[k].shape), tuple(variables[k].shape)) for k in wrong]}."
        )
    backbone_keys = set(variables_by_key(backbone))
    head = {key: variable for key, variable in variables.items() if key not in backbone_keys}
    assign_weights(head, head_arrays, "the authors' ViLBERT checkpoint")
    return model


def _preprocessor(tasks, tokenizer, backbone, task_id, sequence_length, max_regions):
    """The preprocessor the preset carries: one task's own (its class, the
    authors' lengths and task id), or for several heads a `ViLBERTPreprocessor`
    with the longest of their lengths and `--task-id` (without it, each
    head's own task id is saved beside the head, `_head_task_ids`); `None`
    without a tokenizer."""
    if tokenizer is None:
        return None
    if tokenizer.vocabulary_size > backbone.vocabulary_size:
        raise ConversionError(
            f"The vocabulary has {tokenizer.vocabulary_size} tokens but the model only "
            f"{backbone.vocabulary_size} embeddings."
        )
    conversions = [TASKS[task] for task in tasks]
    preprocessor_cls = conversions[0].preprocessor_cls if len(tasks) == 1 else ViLBERTPreprocessor
    arguments = {
        "sequence_length": sequence_length or max(c.sequence_length for c in conversions),
        "max_regions": max_regions or max(c.max_regions for c in conversions),
    }
    if preprocessor_cls is ViLBERTPretrainerPreprocessor:
        if task_id is not None:
            raise ConversionError("--task-id: the pretraining preprocessor adds no task ids.")
    else:
        if task_id is None and backbone.num_task_tokens and len(tasks) == 1:
            task_id = conversions[0].task_id
        arguments["task_id"] = task_id
    return preprocessor_cls(tokenizer, **arguments)


def build(tasks, state_dict, authors_config, tokenizer=None, task_id=None, sequence_length=None, max_regions=None):
    """Converts the heads `tasks` (names in `TASKS`) of the authors'
    checkpoint onto one shared backbone.

    Returns:
        `(models, preprocessor, skipped)`: the tasks (weights assigned), the
        preprocessor the preset carries (`None` without a `tokenizer`) and
        the names of the checkpoint's tensors of heads not converted.

    Raises:
        ConversionError: the checkpoint cannot be converted faithfully.
    """
    authors_config, backbone_config, backbone_arrays = _backbone_parts(state_dict, authors_config)
    _checked_task_id(task_id, backbone_config["num_task_tokens"])
    backbone = ViLBERTBackbone(**backbone_config)
    backbone.assign_arrays(backbone_arrays, "the authors' ViLBERT checkpoint")
    preprocessor = _preprocessor(tasks, tokenizer, backbone, task_id, sequence_length, max_regions)
    own = preprocessor if len(tasks) == 1 else None  # one task's preset holds it as the task's own
    models = [_task(task, backbone, backbone_arrays, state_dict, authors_config, own) for task in tasks]
    skipped, unexpected = leftover_keys(state_dict, {TASKS[task].head for task in tasks})
    if unexpected:
        raise ConversionError(
            f"{len(unexpected)} tensors of the checkpoint were not converted: {', '.join(unexpected)}."
        )
    return models, preprocessor, skipped
