"""Every family under `keras.distribution` (issue 21): each family's task
computes and trains one SGD step under `DataParallel` and under
`ModelParallel` with its backbone's Megatron layout map
(`Backbone.get_layout_map`) exactly as on one device, its variables are
sharded as the map declares (the attention and feed-forward kernels of every
layer over the model axis), the language models generate under
`ModelParallel` what they generate on one device, and a built backbone's map
replicates what the model axis does not divide.

JAX only, on 8 devices (CPU devices, with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`, as `scripts/test.sh`
starts JAX): `DataParallel` over all 8, `ModelParallel` on a mesh of 4
data-parallel by 2 model-parallel devices. Each model is built inside the
distribution's scope and given the single-device model's weights by path.
"""

import functools
import re

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.support.tiny_models import padded_mask
from tests.support.tiny_models import random_ids
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import weights_of

DEVICES_NEEDED = 8

if keras.backend.backend() != "jax":
    pytestmark = pytest.mark.skip(
        reason="keras.distribution's layouts are tested on JAX (where Keras shards variables with jax.sharding)."
    )
else:
    import jax

    pytestmark = pytest.mark.skipif(
        len(jax.devices()) < DEVICES_NEEDED,
        reason=f"needs {DEVICES_NEEDED} JAX devices: start JAX with "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES_NEEDED} (as scripts/test.sh does).",
    )


@pytest.fixture(autouse=True, scope="module")
def quick_compilation():
    """XLA with most optimizations off while these tests run: on a CPU the
    tiny models' training steps then compile about four times faster.
    Sharding is unaffected (SPMD partitioning is no optimization), and the
    single-device references are compiled the same way."""
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


# Sharded sums add in another order: within 1e-5, and 1e-5 relative for the
# few weights one step moves far (ViLBERT's answer head, by up to 14).
TOLERANCE = 1e-5
SHARDED_KERNEL = r".*(attention|feed_forward)/(query|key|value|intermediate|output)/kernel"

# Layouts each family's map must give (besides the blocks' kernels, which
# every case checks): `P(*axes)` of `variable.value.sharding`.
DECLARED_LAYOUTS = {
    "bert_classifier": {
        "token_embedding/embeddings": (None, "model"),
        "transformer_layer_1/self_attention/value/bias": ("model",),
        "transformer_layer_1/self_attention/output/bias": (None,),
        "position_embedding/embeddings": (None, None),
        "classifier/kernel": (None, None),
    },
    "bert_masked_lm": {"token_embedding/embeddings": (None, "model"), "mlm_head/transform/kernel": (None, None)},
    "gpt_causal_lm": {
        "token_embedding/embeddings": (None, "model"),
        "transformer_layer_0/feed_forward/intermediate/bias": ("model",),
        "final_norm/gamma": (None,),
    },
    "gpt_linear_attention": {"transformer_layer_0/self_attention/query/bias": ("model",)},
    "vit_classifier": {
        "patch_embedding/projection/kernel": (None, None, None, "model"),
        "patch_embedding/projection/bias": ("model",),
        "position_embedding/patch_positions": (None, None, None),
    },
    "seq2seq_lm": {
        "token_embedding/embeddings": (None, "model"),
        "decoder_layer_0/cross_attention/key/kernel": (None, "model"),
        "decoder_layer_0/cross_attention/key/bias": ("model",),
        "decoder_layer_0/cross_attention/output/kernel": ("model", None),
    },
    "transformer_xl_backbone": {
        "token_embedding/embeddings_2": (None, "model"),
        "token_embedding/projection_1": ("model", None),
        "transformer_layer_0/position_projection/kernel": (None, "model"),
        "transformer_layer_0/self_attention/content_bias": ("model", None),
        "transformer_layer_0/self_attention/position_bias": ("model", None),
    },
    "transformer_xl_untied_lm": {
        "shared_biases/content_bias": ("model", None),
        "shared_biases/position_bias": ("model", None),
        "lm_head/cluster_weight": (None, "model"),
        "lm_head/output_embeddings_1": (None, "model"),
        "lm_head/projection_2": (None, "model"),
        "lm_head/output_bias_0": (None,),
    },
    "reformer_classifier": {
        "position_embedding/embeddings_0": (None, None, "model"),
        "position_embedding/embeddings_1": (None, None, "model"),
        "reversible/attention_1/self_attention/query/kernel": (None, "model"),  # LSH's shared query-key
        "final_norm/gamma": (None,),
    },
    "vilbert_vqa": {
        "region_embedding/kernel": (None, "model"),
        "box_embedding/bias": ("model",),
        "co_attention_layer_0/visual_cross_attention/output/kernel": ("model", None),
        "co_attention_layer_0/text_feed_forward/intermediate/kernel": (None, "model"),
        "visual_transformer_layer_0/feed_forward/output/kernel": ("model", None),
        "visual_pooler/kernel": (None, None),
    },
}


def _cases():
    """`task_cases()` and Transformer-XL's language model with shared
    biases u, v and an adaptive softmax of its own (untied) tables and
    projections, whose layouts its backbone's map declares too."""
    return {
        **task_cases(),
        "transformer_xl_untied_lm": lambda: (
            azk.models.TransformerXLCausalLM(
                azk.models.TransformerXLBackbone(
                    vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
                    mem_len=4, cutoffs=[10, 20], div_val=2, per_layer_biases=False),
                tie_embeddings=False),
            {"token_ids": random_ids(8, 5)}),
    }


CASES = sorted(_cases())
# Its data-parallel run would repeat `transformer_xl_backbone`'s: it is here
# for the layouts of its head and shared biases.
RUNS = [
    (case, kind) for case in CASES for kind in ("data_parallel", "model_parallel")
    if case != "transformer_xl_untied_lm" or kind == "model_parallel"
]


def _mesh(model_devices=2):
    """`DEVICES_NEEDED` devices, `model_devices` of them along the model axis."""
    shape = (DEVICES_NEEDED // model_devices, model_devices)
    return keras.distribution.DeviceMesh(shape, ["data", "model"], devices=keras.distribution.list_devices())


def _backbone_class(model):
    return type(getattr(model, "backbone", model))


def _distribution(kind, model):
    """`kind`'s distribution for `model`'s family."""
    if kind == "data_parallel":
        # A 1-D mesh: Keras 3.15's DataParallel fails on a 2-D one (its warning
        # about using the first axis passes the axis count as the category).
        return keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    layout_map = _backbone_class(model).get_layout_map(_mesh())
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data")


def _compile(model):
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", metrics=[], weighted_metrics=[])


def _axes(variable):
    """The variable's `PartitionSpec` as a tuple of one entry per axis."""
    spec = tuple(variable.value.sharding.spec)
    return spec + (None,) * (len(variable.shape) - len(spec))


def _flat(outputs):
    return [np.asarray(output) for output in keras.tree.flatten(outputs)]


def _run(model, x):
    """The model's outputs on `x` (`predict_on_batch`) and its weights after
    one SGD step towards zeros."""
    predicted = model.predict_on_batch(x)
    _compile(model)
    model.train_on_batch(x, keras.tree.map_structure(np.zeros_like, predicted))
    return {"outputs": _flat(predicted), "trained": weights_of(model)}


@functools.cache
def _reference(case):
    """The case on one device: its model, inputs, weights, and `_run`."""
    keras.utils.set_random_seed(0)
    model, x = _cases()[case]()
    weights = weights_of(model)
    return model, x, weights, _run(model, x)


def _copy(case, weights):
    """The case's model built in the current distribution, if any (with the
    reference's seeds, for the same dropout masks), holding `weights`."""
    keras.utils.set_random_seed(0)
    model, _ = _cases()[case]()
    for variable in model.weights:
        variable.assign(weights[variable.path])
    return model


@functools.cache
def _distributed(case, kind):
    """`_run` of the case under `kind`'s distribution, from the reference's
    weights, and the layouts of the weights after the step (`axes`)."""
    reference, x, weights, _ = _reference(case)
    with _distribution(kind, reference).scope():
        model = _copy(case, weights)
        run = _run(model, x)
    return {**run, "axes": {variable.path: _axes(variable) for variable in model.weights}}


def _assert_close(actual, expected, what):
    np.testing.assert_allclose(actual, expected, atol=TOLERANCE, rtol=TOLERANCE, err_msg=what)


@pytest.mark.parametrize(("case", "kind"), RUNS)
def test_a_distributed_task_computes_and_trains_as_on_one_device(case, kind):
    weights, expected = _reference(case)[2:]
    assert any(not np.array_equal(weights[key], expected["trained"][key]) for key in weights)  # the step moves them

    run = _distributed(case, kind)

    assert len(run["outputs"]) == len(expected["outputs"])
    for actual, wanted in zip(run["outputs"], expected["outputs"]):
        _assert_close(actual, wanted, f"{case} outputs")
    assert sorted(run["trained"]) == sorted(expected["trained"])
    for key, value in run["trained"].items():
        _assert_close(value, expected["trained"][key], key)
    if kind == "data_parallel":
        assert all(axes == (None,) * len(axes) for axes in run["axes"].values())


def _declared_axes(layout_map, path, rank):
    """The axes `layout_map` gives the variable at `path` (replicated if none)."""
    layout = layout_map[path]
    return tuple(layout.axes) if layout is not None else (None,) * rank


@pytest.mark.parametrize("case", CASES)
def test_variables_are_sharded_as_the_layout_map_declares_through_training(case):
    reference = _reference(case)[0]
    axes = _distributed(case, "model_parallel")["axes"]  # after a training step

    for path, declared in DECLARED_LAYOUTS[case].items():
        assert axes[path] == declared, path
    kernels = [path for path in axes if re.fullmatch(SHARDED_KERNEL, path)]
    assert kernels
    for path in kernels:
        kind = path.split("/")[-2]
        assert axes[path] == (("model", None) if kind == "output" else (None, "model")), path
    # Every variable as the class's map says; a built backbone's map, where the
    # model axis divides every sharded size, is the same.
    mesh = _mesh()
    class_map = _backbone_class(reference).get_layout_map(mesh)
    built_map = getattr(reference, "backbone", reference).get_layout_map(mesh)
    for path, variable_axes in axes.items():
        rank = len(variable_axes)
        assert variable_axes == _declared_axes(class_map, path, rank) == _declared_axes(built_map, path, rank), path


def _randomized(weights):
    """`weights` redrawn from N(0, 0.5) (biases and norms kept), large
    enough that greedy choices are no near-ties."""
    rng = np.random.default_rng(0)
    return {
        path: value if path.endswith(("bias", "beta", "gamma")) else rng.normal(0.0, 0.5, value.shape).astype("float32")
        for path, value in weights.items()
    }


GENERATION_INPUTS = {
    "gpt_causal_lm": ({"token_ids": random_ids(8, 5), "padding_mask": padded_mask(8, 5)}, {}),
    "seq2seq_lm": (
        {"encoder_token_ids": random_ids(8, 5), "encoder_padding_mask": padded_mask(8, 5)},
        {"decoder_start_token_id": 0},
    ),
}


@pytest.mark.parametrize("case", sorted(GENERATION_INPUTS))
def test_generate_under_model_parallel_gives_the_single_device_greedy_output(case):
    inputs, arguments = GENERATION_INPUTS[case]
    weights = _randomized(weights_of(_cases()[case]()[0]))
    model = _copy(case, weights)
    expected = model.generate(inputs, max_new_tokens=4, stop_token_ids=None, **arguments)

    with _distribution("model_parallel", model).scope():
        output = _copy(case, weights).generate(inputs, max_new_tokens=4, stop_token_ids=None, **arguments)

    np.testing.assert_array_equal(output["token_ids"], expected["token_ids"])
    np.testing.assert_array_equal(output["padding_mask"], expected["padding_mask"])


def test_a_built_backbones_map_replicates_what_the_model_axis_does_not_divide():
    """On 4 model devices the Transformer-XL case's 2 heads (u, v) and its
    third adaptive cluster (2 wide) do not split: the class's map fails to
    build the model, the built backbone's replicates them and shards the rest."""
    case = "transformer_xl_backbone"
    reference, x, weights, expected = _reference(case)
    mesh = _mesh(model_devices=4)
    class_map = type(reference).get_layout_map(mesh)
    with pytest.raises(ValueError, match="evenly divide"):
        with keras.distribution.ModelParallel(layout_map=class_map, batch_dim_name="data").scope():
            _copy(case, weights)

    layout_map = reference.get_layout_map(mesh)
    with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data").scope():
        model = _copy(case, weights)
        outputs = _flat(model.predict_on_batch(x))

    axes = {variable.path: _axes(variable) for variable in model.weights}
    for path in ["token_embedding/embeddings_2", "token_embedding/projection_2",
                 "transformer_layer_0/self_attention/content_bias", "transformer_layer_0/self_attention/position_bias"]:
        assert axes[path] == (None, None), path
    assert axes["token_embedding/embeddings_1"] == (None, "model")  # 4 wide
    assert axes["token_embedding/projection_1"] == ("model", None)
    assert axes["transformer_layer_0/self_attention/query/kernel"] == (None, "model")
    assert axes["transformer_layer_0/feed_forward/output/kernel"] == ("model", None)
    for actual, wanted in zip(outputs, expected["outputs"]):
        _assert_close(actual, wanted, "outputs")


def test_the_layout_map_refuses_axes_the_mesh_lacks():
    mesh = _mesh()
    with pytest.raises(ValueError, match=r"model_axis='tensor' is not an axis of the device mesh"):
        azk.models.GPTBackbone.get_layout_map(mesh, model_axis="tensor")
    with pytest.raises(ValueError, match="must be different mesh axes"):
        azk.models.GPTBackbone.get_layout_map(mesh, model_axis="data", data_axis="data")


def test_a_separate_target_vocabulary_is_sharded_on_the_hidden_axis():
    layout_map = azk.models.TransformerBackbone.get_layout_map(_mesh())
    with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data").scope():
        backbone = azk.models.TransformerBackbone(
            vocabulary_size=30, target_vocabulary_size=20, num_encoder_layers=1, num_decoder_layers=1, num_heads=2,
            hidden_dim=8, intermediate_dim=16, max_sequence_length=16,
        )
    axes = {variable.path: _axes(variable) for variable in backbone.weights}
    assert axes["token_embedding/embeddings"] == axes["target_token_embedding/embeddings"] == (None, "model")


def test_from_preset_under_model_parallel_places_each_tensor_in_its_shards(tmp_path):
    """A preset loads straight into sharded variables (created holding their
    values, each host array put onto its shards), and computes as the model
    that was saved."""
    keras.utils.set_random_seed(0)
    lm = azk.models.GPTCausalLM(azk.models.GPTBackbone(
        vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16,
    ))
    lm.save_to_preset(tmp_path)
    x = {"token_ids": random_ids(8, 6), "padding_mask": padded_mask(8, 6)}
    expected = _flat(lm.predict_on_batch(x))
    distribution = keras.distribution.ModelParallel(
        layout_map=azk.models.GPTBackbone.get_layout_map(_mesh()), batch_dim_name="data"
    )
    with distribution.scope():
        loaded = azk.models.GPTCausalLM.from_preset(tmp_path, preprocessor=None)
        outputs = _flat(loaded.predict_on_batch(x))
    axes = {variable.path: _axes(variable) for variable in loaded.weights}
    assert axes["transformer_layer_1/self_attention/query/kernel"] == (None, "model")
    assert axes["transformer_layer_1/feed_forward/output/kernel"] == ("model", None)
    assert axes["token_embedding/embeddings"] == (None, "model")
    for actual, wanted in zip(outputs, expected):
        _assert_close(actual, wanted, "outputs")
