"""`azk-convert vilbert`, end to end: the authors' `.bin` (the golden
fixture's `state_dict`, written as their checkpoints are) to native presets
whose tasks reproduce the authors' code (`tests/fixtures/vilbert`): one
preset per head (`--task`), or one preset serving every head."""

import contextlib
import io
import json
from pathlib import Path

import keras
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import attention_zoo_keras as azk
from attention_zoo_keras.conversion import cli
from attention_zoo_keras.conversion import vilbert
from attention_zoo_keras.models.vilbert import ViLBERTImageTextRetriever
from attention_zoo_keras.models.vilbert import ViLBERTPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTPretrainer
from attention_zoo_keras.models.vilbert import ViLBERTPretrainerPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTRegionScorer
from attention_zoo_keras.models.vilbert import ViLBERTRetrievalPreprocessor
from attention_zoo_keras.models.vilbert import ViLBERTVisualQuestionAnswerer
from attention_zoo_keras.registration import registered_class

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "vilbert"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"the ViLBERT golden fixture is not at {FIXTURE}")

from tests.support.vilbert_golden import load  # noqa: E402
from tests.support.vilbert_golden import our_inputs  # noqa: E402

ATOL = 1e-4
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"word{i}" for i in range(94)]


def _numpy(value):
    return keras.ops.convert_to_numpy(value)


def _write_authors_files(directory, state_dict=None, config_changes=None, prefix=""):
    """The authors' checkpoint `.bin`, config and vocab.txt in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    state_dict = load_file(str(FIXTURE / "model.safetensors")) if state_dict is None else state_dict
    torch.save({prefix + name: tensor for name, tensor in state_dict.items()}, directory / "model.bin")
    config = {**json.loads((FIXTURE / "config.json").read_text()), **(config_changes or {})}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "vocab.txt").write_text("\n".join(VOCABULARY) + "\n")
    return directory


def _convert(files, destination, *arguments, checkpoint=None, vocab=True):
    checkpoint = files / "model.bin" if checkpoint is None else checkpoint
    argv = ["vilbert", checkpoint, files / "config.json", destination, *arguments]
    return cli.main([str(arg) for arg in argv] + (["--vocab", str(files / "vocab.txt")] if vocab else []))


@pytest.fixture(scope="module")
def authors_files(tmp_path_factory):
    assert len(VOCABULARY) == json.loads((FIXTURE / "config.json").read_text())["vocab_size"] == 99
    return _write_authors_files(tmp_path_factory.mktemp("authors"))


@pytest.fixture(scope="module")
def module_prefixed_files(tmp_path_factory):
    """The same checkpoint saved from a DataParallel model: `module.` names."""
    return _write_authors_files(tmp_path_factory.mktemp("authors_module"), prefix="module.")


@pytest.fixture(scope="module")
def converted(authors_files, module_prefixed_files, tmp_path_factory):
    """`converted(task)`: `(preset directory, what the command printed)` of
    the one-head conversion `--task task`, converted once per module
    (retrieval from the `module.`-prefixed .bin)."""
    done = {}

    def convert(task):
        if task not in done:
            files = module_prefixed_files if task == "retrieval" else authors_files
            destination = tmp_path_factory.mktemp("presets") / task
            with contextlib.redirect_stdout(io.StringIO()) as out:
                assert _convert(files, destination, "--task", task) == 0
            done[task] = destination, out.getvalue()
        return done[task]

    return convert


# --- the converted presets reproduce the authors' code -----------------------


def test_vqa_preset_matches_the_authors_vil_prediction(converted):
    model = ViLBERTVisualQuestionAnswerer.from_preset(str(converted("vqa")[0]))
    assert model.num_answers == 3129
    card = (converted("vqa")[0] / "README.md").read_text()
    assert "license: mit" in card and "## Source" in card and "ViLBERT (Lu et al., 2019)" in card
    assert "pipeline_tag: visual-question-answering" in card
    actual = _numpy(model(our_inputs(load("inputs"))))
    np.testing.assert_allclose(actual, load("outputs")["vil_prediction"], atol=ATOL)


def test_pretrainer_preset_matches_the_authors_heads(converted):
    model = ViLBERTPretrainer.from_preset(str(converted("pretrainer")[0]))
    assert model.num_region_classes == 11
    inputs = our_inputs(load("inputs"))
    batch, length = inputs["token_ids"].shape
    inputs["mask_positions"] = np.tile(np.arange(length, dtype="int32"), (batch, 1))
    outputs = model(inputs)
    expected = load("outputs")
    np.testing.assert_allclose(_numpy(outputs["token_logits"]), expected["linguisic_prediction"], atol=ATOL)
    np.testing.assert_allclose(_numpy(outputs["region_logits"]), expected["vision_prediction"], atol=ATOL)


def test_retrieval_preset_from_a_module_prefixed_bin_matches_the_authors_vil_logit(converted):
    model = ViLBERTImageTextRetriever.from_preset(str(converted("retrieval")[0]))
    inputs = {name: value[:, None] for name, value in our_inputs(load("inputs")).items()}  # one candidate each
    actual = _numpy(model(inputs))
    np.testing.assert_allclose(actual, load("outputs")["vil_logit"], atol=ATOL)


def test_region_scorer_preset_matches_the_authors_vision_logit(converted):
    model = ViLBERTRegionScorer.from_preset(str(converted("region_scorer")[0]))
    inputs = our_inputs(load("inputs"))
    actual = _numpy(model(inputs))
    expected = load("outputs")["vision_logit"][..., 0]
    real = inputs["region_mask"].astype(bool)
    np.testing.assert_allclose(actual[real], expected[real], atol=ATOL)
    # Padded regions carry -10000, where float32 steps are about 1e-3.
    np.testing.assert_allclose(actual[~real], expected[~real], rtol=1e-6)


def test_gqa_from_safetensors_with_the_module_prefix(tmp_path):
    """DataParallel's `module.` prefix is stripped, and `.safetensors` is read too."""
    state_dict = {f"module.{name}": t for name, t in load_file(str(FIXTURE / "model.safetensors")).items()}
    files = _write_authors_files(tmp_path / "authors")
    from safetensors.torch import save_file

    save_file(state_dict, str(files / "model.safetensors"))
    assert _convert(files, tmp_path / "gqa", "--task", "gqa", checkpoint=files / "model.safetensors") == 0
    model = ViLBERTVisualQuestionAnswerer.from_preset(str(tmp_path / "gqa"))
    assert model.num_answers == 1533
    np.testing.assert_allclose(
        _numpy(model(our_inputs(load("inputs")))), load("outputs")["vil_prediction_gqa"], atol=ATOL
    )


# --- preprocessors ----------------------------------------------------------


@pytest.mark.parametrize(
    "task, task_cls, preprocessor_cls, sequence_length, max_regions",
    [
        ("vqa", ViLBERTVisualQuestionAnswerer, ViLBERTPreprocessor, 23, 101),
        ("region_scorer", ViLBERTRegionScorer, ViLBERTPreprocessor, 20, 101),
        ("pretrainer", ViLBERTPretrainer, ViLBERTPretrainerPreprocessor, 36, 37),
    ],
)
def test_preset_preprocessor_has_the_authors_lengths(converted, task, task_cls, preprocessor_cls, sequence_length,
                                                    max_regions):
    preprocessor = task_cls.from_preset(str(converted(task)[0])).preprocessor
    assert type(preprocessor) is preprocessor_cls
    assert (preprocessor.sequence_length, preprocessor.max_regions) == (sequence_length, max_regions)
    assert preprocessor.task_id is None  # the fixture has no task tokens
    assert preprocessor.tokenizer.vocabulary_size == 99
    assert preprocessor.tokenizer.encode(["Word5 word7"]) == [[10, 12]]  # lower-cased, as bert-base-uncased


def test_retrieval_preset_holds_its_preprocessor(converted):
    preprocessor = ViLBERTImageTextRetriever.from_preset(str(converted("retrieval")[0])).preprocessor
    assert isinstance(preprocessor, ViLBERTRetrievalPreprocessor)
    assert (preprocessor.sequence_length, preprocessor.max_regions) == (30, 101)


def test_vqa_preset_answers_raw_questions(converted):
    model = ViLBERTVisualQuestionAnswerer.from_preset(str(converted("vqa")[0]))
    rng = np.random.default_rng(0)
    raw = {
        "text": ["word5 word6 word7 ?", "word8"],
        "regions": [rng.normal(size=(3, 24)).astype("float32"), rng.normal(size=(2, 24)).astype("float32")],
        "boxes": [np.array([[0, 0, 10, 10], [5, 5, 20, 15], [0, 0, 30, 20]], "float32"),
                  np.array([[0, 0, 10, 10], [5, 5, 20, 15]], "float32")],
        "image_size": (20, 30),
    }
    features = model.preprocessor(raw)
    assert features["token_ids"].shape[0] == 2 and features["token_ids"].shape[1] <= 23  # the authors' 23 at most
    assert features["region_features"].shape[0] == 2 and features["region_features"].shape[2] == 24
    np.testing.assert_allclose(model.predict(raw, verbose=0), _numpy(model(features)), atol=1e-5)


def test_task_tokens_and_overridden_lengths(tmp_path, capsys):
    """A multi-task checkpoint (task embeddings): the authors' task id by
    default, and the command line's lengths."""
    state_dict = load_file(str(FIXTURE / "model.safetensors"))
    task_embeddings = torch.randn(20, 32, generator=torch.Generator().manual_seed(0))
    state_dict["bert.embeddings.task_embeddings.weight"] = task_embeddings
    files = _write_authors_files(tmp_path / "authors", state_dict, {"task_specific_tokens": True})
    assert _convert(files, tmp_path / "vqa", "--task", "vqa", "--sequence-length", "12", "--max-regions", "7") == 0
    model = ViLBERTVisualQuestionAnswerer.from_preset(str(tmp_path / "vqa"))
    assert model.backbone.num_task_tokens == 20
    preprocessor = model.preprocessor
    assert (preprocessor.sequence_length, preprocessor.max_regions, preprocessor.task_id) == (12, 7, 1)
    np.testing.assert_array_equal(_numpy(model.backbone.get_layer("task_embedding").embeddings), task_embeddings)

    # The authors' config file does not say; the checkpoint decides.
    config = json.loads((files / "config.json").read_text())
    del config["task_specific_tokens"]
    (files / "config.json").write_text(json.dumps(config))
    assert _convert(files, tmp_path / "refcoco", "--task", "region_scorer", "--task-id", "4") == 0
    assert ViLBERTRegionScorer.from_preset(str(tmp_path / "refcoco")).preprocessor.task_id == 4

    # A config that contradicts the checkpoint is refused.
    (files / "config.json").write_text(json.dumps({**config, "task_specific_tokens": False}))
    error = _refused(files, tmp_path / "contradiction", capsys, "--task", "vqa")
    assert "task_specific_tokens=False but the checkpoint has 'bert.embeddings.task_embeddings.weight'" in error

    # The multi-task checkpoint is no pretrainer: ViLBERTPretrainer takes no task tokens.
    (files / "config.json").write_text(json.dumps(config))
    error = _refused(files, tmp_path / "pretrainer", capsys, "--task", "pretrainer")
    assert "this checkpoint has task tokens" in error

    # One conversion of the multi-task checkpoint: every head but the pretraining ones, each loading
    # with the authors' task id for it.
    capsys.readouterr()
    assert _convert(files, tmp_path / "every_head") == 0
    printed = capsys.readouterr().out
    assert "the pretraining heads (cls) are not converted: ViLBERTPretrainer takes a checkpoint without task " \
        "tokens" in printed
    assert ("each head loads with the task id it was trained with (ViLBERTVisualQuestionAnswerer 1, "
            "ViLBERTImageTextRetriever 8, ViLBERTRegionScorer 11)") in printed
    heads = json.loads((tmp_path / "every_head" / "config.json").read_text())["heads"]
    assert sorted(heads) == ["ViLBERTImageTextRetriever", "ViLBERTRegionScorer", "ViLBERTVisualQuestionAnswerer"]
    task_ids = {
        task_cls: task_cls.from_preset(str(tmp_path / "every_head"), load_weights=False).preprocessor.task_id
        for task_cls in (ViLBERTVisualQuestionAnswerer, ViLBERTImageTextRetriever, ViLBERTRegionScorer)
    }
    assert task_ids == {ViLBERTVisualQuestionAnswerer: 1, ViLBERTImageTextRetriever: 8, ViLBERTRegionScorer: 11}
    assert ViLBERTPreprocessor.from_preset(str(tmp_path / "every_head")).task_id is None  # no head named
    scorer = ViLBERTRegionScorer.from_preset(str(tmp_path / "every_head"))
    assert scorer.preprocessor.task_id == 11
    reference = ViLBERTRegionScorer.from_preset(str(tmp_path / "refcoco"), preprocessor=None)
    features = our_inputs(load("inputs"))
    features["task_ids"] = np.full((features["token_ids"].shape[0], 1), 4, "int32")
    np.testing.assert_array_equal(_numpy(scorer(features)), _numpy(reference(features)))


# --- what is refused, with nothing written ------------------------------------


def _refused(files, destination, capsys, *arguments):
    assert _convert(files, destination, *arguments) == 1
    assert not destination.exists()
    assert not [p for p in destination.parent.iterdir() if p.name.startswith(f".{destination.name}")]
    return capsys.readouterr().err


def test_untied_decoder_is_refused(tmp_path, capsys):
    state_dict = load_file(str(FIXTURE / "model.safetensors"))
    state_dict["cls.predictions.decoder.weight"] = state_dict["cls.predictions.decoder.weight"] + 1.0
    files = _write_authors_files(tmp_path / "authors", state_dict)
    error = _refused(files, tmp_path / "pretrainer", capsys, "--task", "pretrainer")
    assert "'cls.predictions.decoder.weight' differs from 'bert.embeddings.word_embeddings.weight'" in error
    assert "Nothing saved" in error


def test_unexpected_extra_key_is_refused(tmp_path, capsys):
    state_dict = load_file(str(FIXTURE / "model.safetensors"))
    state_dict["bert.encoder.extra.weight"] = torch.zeros(3)
    state_dict["vil_prediction.logit_fc.5.weight"] = torch.zeros(3)
    files = _write_authors_files(tmp_path / "authors", state_dict)
    error = _refused(files, tmp_path / "vqa", capsys, "--task", "vqa")
    assert "2 tensors of the checkpoint were not converted" in error
    assert "bert.encoder.extra.weight" in error and "vil_prediction.logit_fc.5.weight" in error


def test_other_heads_are_skipped_by_name_and_the_reload_is_identical(converted):
    printed = converted("region_scorer")[1]
    assert ("skipped 37 tensors of heads not converted: cls, linguisic_logit, vil_binary_prediction, "
            "vil_logit, vil_prediction, vil_prediction_gqa, vil_tri_prediction") in printed
    assert "max |converted - reloaded from the preset| on random inputs: 0.00e+00" in printed
    assert "skipped 26 tensors" in converted("pretrainer")[1]  # every head but cls


def test_failed_verification_writes_nothing(authors_files, tmp_path, capsys, monkeypatch):
    """A preset that does not load back as converted is never moved into place."""
    monkeypatch.setattr(vilbert, "verify", lambda models, directory, preprocessor=None: 1.0)
    error = _refused(authors_files, tmp_path / "vqa", capsys, "--task", "vqa")
    assert "the reloaded preset differs by 1.00e+00" in error
    assert list(tmp_path.iterdir()) == []


def test_task_id_without_task_tokens_is_refused(authors_files, tmp_path, capsys):
    error = _refused(authors_files, tmp_path / "vqa", capsys, "--task", "vqa", "--task-id", "1")
    assert "--task-id needs a checkpoint with task tokens" in error


def test_missing_head_is_refused(tmp_path, capsys):
    state_dict = load_file(str(FIXTURE / "model.safetensors"))
    state_dict = {name: tensor for name, tensor in state_dict.items() if not name.startswith("vil_logit")}
    files = _write_authors_files(tmp_path / "authors", state_dict)
    error = _refused(files, tmp_path / "retrieval", capsys, "--task", "retrieval")
    assert "vil_logit.weight" in error


class Payload:
    """A class a pickled checkpoint names (a hostile one would name `os.system`)."""


def test_a_bin_holding_objects_is_refused_without_unsafe_advice(authors_files, tmp_path, capsys):
    torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(2), "payload": Payload()}, tmp_path / "model.bin")
    assert _convert(authors_files, tmp_path / "out", checkpoint=tmp_path / "model.bin") == 1
    error = capsys.readouterr().err
    assert f"'{tmp_path / 'model.bin'}' holds the Python object `{__name__}.Payload`, so it was not loaded" in error
    assert "Nothing saved" in error
    # torch's message advises re-running with weights_only=False ("will likely succeed") or allow-listing the
    # class: running code from an untrusted file. It is never passed on.
    assert "weights_only=False" not in error and "`weights_only` set to `False`" not in error
    assert "safe_globals" not in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.bin"]


def test_a_destination_that_is_not_a_preset_is_refused_and_kept(authors_files, tmp_path, capsys):
    destination = tmp_path / "mine"
    destination.mkdir()
    (destination / "notes.txt").write_text("keep me")
    assert _convert(authors_files, destination) == 2
    error = capsys.readouterr().err
    assert f"'{destination}'" in error and "notes.txt" in error and "not a preset" in error
    assert [path.name for path in destination.iterdir()] == ["notes.txt"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine"]


# --- one preset for every head -------------------------------------------------


@pytest.fixture(scope="module")
def every_head(authors_files, tmp_path_factory):
    """`(preset, printed)`: the checkpoint converted once, with no --task."""
    destination = tmp_path_factory.mktemp("every_head") / "vilbert"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert _convert(authors_files, destination) == 0
    return destination, out.getvalue()


def _same_outputs(model, reference, inputs):
    outputs, expected = model(inputs), reference(inputs)
    if not isinstance(outputs, dict):
        outputs, expected = {"output": outputs}, {"output": expected}
    assert set(outputs) == set(expected)
    for name in outputs:
        np.testing.assert_array_equal(_numpy(outputs[name]), _numpy(expected[name]), err_msg=name)


def test_one_conversion_serves_every_head_as_the_per_head_conversions_do(every_head, converted):
    preset, printed = every_head
    config = json.loads((preset / "config.json").read_text())
    assert config["class_name"] == "ViLBERTBackbone"
    assert sorted(config["heads"]) == [
        "ViLBERTImageTextRetriever", "ViLBERTPretrainer", "ViLBERTRegionScorer", "ViLBERTVisualQuestionAnswerer",
    ]
    assert "with the heads of ViLBERTPretrainer, ViLBERTVisualQuestionAnswerer, ViLBERTImageTextRetriever, " \
        "ViLBERTRegionScorer" in printed
    assert "the gqa head (vil_prediction_gqa) shares ViLBERTVisualQuestionAnswerer" in printed
    assert "--task gqa" in printed

    inputs = our_inputs(load("inputs"))
    pretraining = {**inputs, "mask_positions": np.tile(np.arange(inputs["token_ids"].shape[1], dtype="int32"),
                                                      (inputs["token_ids"].shape[0], 1))}
    retrieval = {name: value[:, None] for name, value in inputs.items()}
    for task, task_cls, x in [
        ("pretrainer", ViLBERTPretrainer, pretraining),
        ("vqa", ViLBERTVisualQuestionAnswerer, inputs),
        ("retrieval", ViLBERTImageTextRetriever, retrieval),
        ("region_scorer", ViLBERTRegionScorer, inputs),
    ]:
        model = task_cls.from_preset(str(preset))
        _same_outputs(model, task_cls.from_preset(str(converted(task)[0])), x)
        assert model.preprocessor.tokenizer.encode(["Word5 word7"]) == [[10, 12]]
    np.testing.assert_allclose(
        _numpy(ViLBERTVisualQuestionAnswerer.from_preset(str(preset))(inputs)), load("outputs")["vil_prediction"],
        atol=ATOL,
    )
    # The shared preprocessor: the longest of the heads' lengths (the pretrainer's 36), 100 regions + the image.
    preprocessor = ViLBERTPreprocessor.from_preset(str(preset))
    assert (preprocessor.sequence_length, preprocessor.max_regions, preprocessor.task_id) == (36, 101, None)


def test_without_a_vocabulary_the_preset_takes_token_ids(authors_files, tmp_path, capsys):
    assert _convert(authors_files, tmp_path / "features", "--task", "vqa", "--task", "region_scorer", vocab=False) == 0
    printed = capsys.readouterr().out
    assert "no tokenizer (no --vocab)" in printed and "preprocessor=None" in printed
    assert not (tmp_path / "features" / "tokenizer.json").exists()
    assert not (tmp_path / "features" / "preprocessor.json").exists()
    assert sorted(json.loads((tmp_path / "features" / "config.json").read_text())["heads"]) == [
        "ViLBERTRegionScorer", "ViLBERTVisualQuestionAnswerer",
    ]
    model = ViLBERTVisualQuestionAnswerer.from_preset(str(tmp_path / "features"), preprocessor=None)
    np.testing.assert_allclose(_numpy(model(our_inputs(load("inputs")))), load("outputs")["vil_prediction"], atol=ATOL)


def test_heads_of_one_class_are_refused_together(authors_files, tmp_path, capsys):
    error = _refused(authors_files, tmp_path / "both", capsys, "--task", "vqa", "--task", "gqa")
    assert "--task vqa and gqa are heads of one class (ViLBERTVisualQuestionAnswerer)" in error


# --- the named presets ------------------------------------------------------


@pytest.mark.parametrize(
    "name, class_name, source",
    [
        ("vilbert_conceptual_captions", "ViLBERTPretrainer", "hf://attention-zoo-keras/vilbert-conceptual-captions"),
        ("vilbert_multitask", "ViLBERTVisualQuestionAnswerer", "hf://attention-zoo-keras/vilbert-multi-task"),
    ],
)
def test_named_presets_name_registered_classes(name, class_name, source):
    entry = json.loads((ROOT / "presets" / f"{name}.json").read_text())
    assert entry == azk.list_presets(family="vilbert")[name]
    assert (entry["class_name"], entry["source"], entry["license"]) == (class_name, source, "mit")
    assert registered_class(entry["class_name"]).__name__ == class_name
    assert isinstance(entry["params"], int) and entry["params"] > 2e8
