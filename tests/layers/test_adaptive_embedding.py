"""`AdaptiveEmbedding` against a numpy transcription of Transformer-XL's
adaptive input (transformers' `AdaptiveEmbedding.forward`):

    e(w) = √d_proj · E_i[w − start_i] P_i      (P_i absent when div_val == 1 and d_proj == d_embed)
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras.layers.adaptive_embedding import AdaptiveEmbedding
from attention_zoo_keras.registration import deserialize
from attention_zoo_keras.registration import serialize

VOCABULARY = 23


def randomize(layer, seed=0):
    """Every variable set to N(0, 1) values, so no cluster looks like another."""
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.standard_normal(variable.shape).astype("float32"))


def reference(token_ids, layer):
    """transformers' forward in numpy (float64): per cluster, the ids that
    belong to it are looked up, projected and written to their places."""
    tables = [keras.ops.convert_to_numpy(table).astype("float64") for table in layer.embeddings]
    projections = [None if p is None else keras.ops.convert_to_numpy(p).astype("float64") for p in layer.projections]
    if layer.div_val == 1:
        bounds = [(0, layer.vocabulary_size)]
    else:
        edges = [0] + list(layer.cutoffs) + [layer.vocabulary_size]
        bounds = list(zip(edges, edges[1:]))
    output = np.zeros(token_ids.shape + (layer.output_dim,))
    for (start, stop), table, projection in zip(bounds, tables, projections):
        member = (token_ids >= start) & (token_ids < stop)
        vectors = table[token_ids[member] - start]
        if projection is not None:
            vectors = vectors @ projection
        output[member] = vectors
    return output * np.sqrt(layer.output_dim)


def every_id_around_the_cutoffs(cutoffs):
    """Every id of the vocabulary (so each cluster's first and last), plus
    id 0 again, shuffled into a `(2, 12)` batch."""
    ids = np.random.default_rng(1).permutation(np.append(np.arange(VOCABULARY), 0))
    for cutoff in cutoffs:
        assert {cutoff - 1, cutoff} <= set(ids.tolist())
    return ids.reshape(2, -1).astype("int32")


CASES = {
    # div_val 1: one table over the whole vocabulary, cutoffs only matter to the softmax.
    "div1_no_projection": dict(embedding_dim=8, output_dim=8, cutoffs=(5, 11), div_val=1),
    "div1_projection": dict(embedding_dim=8, output_dim=6, cutoffs=(5, 11), div_val=1),
    "div2_three_cutoffs": dict(embedding_dim=8, output_dim=6, cutoffs=(4, 9, 15), div_val=2),
    "div2_no_cutoffs": dict(embedding_dim=8, output_dim=8, cutoffs=(), div_val=2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_transformers_formula(case):
    arguments = CASES[case]
    layer = AdaptiveEmbedding(VOCABULARY, **arguments)
    layer.build()
    randomize(layer)
    token_ids = every_id_around_the_cutoffs(arguments["cutoffs"])
    output = keras.ops.convert_to_numpy(layer(token_ids))
    assert output.shape == token_ids.shape + (arguments["output_dim"],)
    np.testing.assert_allclose(output, reference(token_ids, layer), rtol=1e-5, atol=1e-5)


def test_weights_shapes_names_and_orientation():
    layer = AdaptiveEmbedding(VOCABULARY, 8, output_dim=6, cutoffs=(4, 9, 15), div_val=2)
    layer.build()
    assert [tuple(t.shape) for t in layer.embeddings] == [(4, 8), (5, 4), (6, 2), (8, 1)]
    assert [tuple(p.shape) for p in layer.projections] == [(8, 6), (4, 6), (2, 6), (1, 6)]
    assert [t.name for t in layer.embeddings] == ["embeddings_0", "embeddings_1", "embeddings_2", "embeddings_3"]
    assert [p.name for p in layer.projections] == ["projection_0", "projection_1", "projection_2", "projection_3"]
    assert len(layer.trainable_weights) == 8

    single = AdaptiveEmbedding(VOCABULARY, 8, output_dim=8, cutoffs=(4, 9), div_val=1)
    single.build()
    assert [tuple(t.shape) for t in single.embeddings] == [(VOCABULARY, 8)]
    assert single.projections == [None]
    assert len(single.trainable_weights) == 1

    projected = AdaptiveEmbedding(VOCABULARY, 8, output_dim=6, cutoffs=(4, 9), div_val=1)
    projected.build()
    assert [tuple(p.shape) for p in projected.projections] == [(8, 6)]


def test_scale_is_sqrt_output_dim():
    layer = AdaptiveEmbedding(10, 4, output_dim=4)
    layer.build()
    layer.embeddings[0].assign(np.ones((10, 4), "float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(np.array([3]))), np.full((1, 4), 2.0))


@pytest.mark.parametrize("case", ["div1_projection", "div2_three_cutoffs"])
def test_inside_a_compiled_model(case):
    arguments = CASES[case]
    layer = AdaptiveEmbedding(VOCABULARY, **arguments)
    token_ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(token_ids, layer(token_ids))
    randomize(layer)
    batch = every_id_around_the_cutoffs(arguments["cutoffs"])
    predicted = model.predict(batch, verbose=0)
    np.testing.assert_allclose(predicted, reference(batch, layer), rtol=1e-5, atol=1e-5)


def test_config_round_trip():
    layer = AdaptiveEmbedding(VOCABULARY, 8, output_dim=6, cutoffs=(4, 9, 15), div_val=2, name="adaptive_input")
    layer.build()
    randomize(layer)
    config = layer.get_config()
    assert config["cutoffs"] == [4, 9, 15] and config["div_val"] == 2 and config["output_dim"] == 6
    rebuilt = deserialize(serialize(layer))
    assert isinstance(rebuilt, AdaptiveEmbedding) and rebuilt.get_config() == config
    rebuilt.build()
    rebuilt.set_weights(layer.get_weights())
    token_ids = every_id_around_the_cutoffs((4, 9, 15))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(rebuilt(token_ids)), keras.ops.convert_to_numpy(layer(token_ids))
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(cutoffs=(9, 4)), "strictly increasing"),
        (dict(cutoffs=(4, 4)), "strictly increasing"),
        (dict(cutoffs=(0, 4)), "strictly increasing"),
        (dict(cutoffs=(4, VOCABULARY)), "below vocabulary_size"),
        (dict(cutoffs=(4, 30)), "below vocabulary_size"),
        (dict(div_val=0), "div_val"),
        (dict(div_val=1.5), "div_val"),
        (dict(div_val=16, cutoffs=(4,)), "no width"),
        (dict(output_dim=0), "output_dim"),
    ],
)
def test_bad_arguments(arguments, message):
    arguments = {"vocabulary_size": VOCABULARY, "embedding_dim": 8, "output_dim": 6, **arguments}
    with pytest.raises(ValueError, match=message):
        AdaptiveEmbedding(**arguments)


def test_mixed_precision_table_gradient_is_summed_in_float32():
    """As `layers.Embedding` (tests/layers/test_embedding.py): 2,000
    positions of one token, from a model's `stateless_call`; the scale
    √d_out = 2 is exact, so the upstream gradient the table receives holds
    bfloat16 numbers, whose float64 sums are the reference."""
    from attention_zoo_keras import backend_support

    rng = np.random.default_rng(0)
    ids = np.where(rng.random((4, 500)) < 0.9, 1, rng.integers(0, 5, (4, 500))).astype("int32")
    inputs = keras.Input((500,), dtype="int32")
    model = keras.Model(inputs, AdaptiveEmbedding(5, 4, output_dim=4, dtype="mixed_bfloat16")(inputs))
    cotangent = keras.ops.cast(rng.normal(size=(4, 500, 4)).astype("float32"), "bfloat16")
    _, pullback = backend_support.vjp(
        lambda tables: model.stateless_call(tables, [], ids)[0], [model.trainable_variables[0].value]
    )
    (gradient,) = pullback(cotangent)
    expected = np.zeros((5, 4))
    upstream = keras.ops.convert_to_numpy(keras.ops.cast(cotangent, "float32")).reshape(-1, 4).astype("float64")
    np.add.at(expected, ids.reshape(-1), 2.0 * upstream)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(gradient), expected, rtol=1e-4, atol=1e-4)
