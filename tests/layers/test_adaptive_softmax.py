"""`AdaptiveLogSoftmax` against `torch.nn.AdaptiveLogSoftmaxWithLoss.log_prob`
and against a numpy transcription of transformers' Transformer-XL
`ProjectedAdaptiveLogSoftmax.forward` (without labels):

    head      = log_softmax([h P₀ W₀ᵀ + b₀ ; h P₀ Cᵀ + c])
    log p(w)  = head[w]                                           w < c₁
    log p(w)  = head[c₁ + i − 1] + log_softmax(h Pᵢ Wᵢᵀ + bᵢ)[w − cᵢ]    w in cluster i ≥ 1
"""

import keras
import numpy as np
import pytest
import torch

from attention_zoo_keras.layers.adaptive_embedding import AdaptiveEmbedding
from attention_zoo_keras.layers.adaptive_softmax import AdaptiveLogSoftmax
from attention_zoo_keras.registration import deserialize
from attention_zoo_keras.registration import serialize

VOCABULARY = 23
CUTOFFS = (4, 9, 15)
# A target in every cluster (first and last ids included).
TARGETS = np.array([[0, 3, 4, 8], [9, 14, 15, 22]], "int32")


def numpy(x):
    return None if x is None else np.asarray(keras.ops.convert_to_numpy(x), "float64")


def randomize(layer, seed=0):
    """Every variable of `layer` (and of a tied embedding) set to N(0, 0.5²)."""
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(0.5 * rng.standard_normal(variable.shape).astype("float32"))


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def reference(hidden, vocabulary_size, cutoffs, div_val, tables, biases, kernels, cluster_weight, cluster_bias):
    """transformers' `ProjectedAdaptiveLogSoftmax` without labels, in numpy
    (float64). `kernels[i]` multiplies the hidden states (`h @ kernels[i]`,
    transformers' `out_projs[i]`) or is None."""
    hidden = np.asarray(hidden, "float64")
    edges = [0] + list(cutoffs) + [vocabulary_size]
    bounds = list(zip(edges, edges[1:]))
    if div_val == 1:
        tables = [tables[0][start:stop] for start, stop in bounds]
        biases = [biases[0][start:stop] for start, stop in bounds]

    def logits(i, table, bias):
        projected = hidden if kernels[i] is None else hidden @ kernels[i]
        return projected @ table.T + bias

    if not cutoffs:
        return log_softmax(logits(0, tables[0], biases[0]))
    head = log_softmax(
        logits(0, np.concatenate([tables[0], cluster_weight]), np.concatenate([biases[0], cluster_bias]))
    )
    output = np.empty(hidden.shape[:-1] + (vocabulary_size,))
    output[..., : cutoffs[0]] = head[..., : cutoffs[0]]
    for i in range(1, len(bounds)):
        start, stop = bounds[i]
        output[..., start:stop] = head[..., cutoffs[0] + i - 1, None] + log_softmax(logits(i, tables[i], biases[i]))
    return output


def reference_of(layer, hidden, kernels=None):
    """`reference` with `layer`'s weights; `kernels` default to the layer's
    own projections."""
    if kernels is None:
        kernels = [numpy(p) for p in layer.projections]
    return reference(
        hidden,
        layer.vocabulary_size,
        layer.cutoffs,
        layer.div_val,
        [numpy(t) for t in layer.output_embeddings],
        [numpy(b) for b in layer.output_biases],
        kernels,
        numpy(layer.cluster_weight),
        numpy(layer.cluster_bias),
    )


def hidden_states(input_dim, seed=1):
    return np.random.default_rng(seed).standard_normal((2, 4, input_dim)).astype("float32")


# --- against torch.nn.AdaptiveLogSoftmaxWithLoss -------------------------------


@pytest.mark.parametrize("head_bias", [False, True])
def test_matches_torch_adaptive_log_softmax(head_bias):
    torch.manual_seed(0)
    theirs = torch.nn.AdaptiveLogSoftmaxWithLoss(8, VOCABULARY, list(CUTOFFS), div_value=2.0, head_bias=head_bias)
    layer = AdaptiveLogSoftmax(VOCABULARY, 8, input_dim=8, cutoffs=CUTOFFS, div_val=2)
    layer.build((None, 8))
    # torch's tail cluster i is Linear(8, 8 // 2**i) then Linear(8 // 2**i, size_i): our
    # projection_i (input_dim, d_i) and output table (size_i, d_i). Its head has no
    # projection: ours is the identity.
    head_weight = theirs.head.weight.detach().numpy()
    layer.output_embeddings[0].assign(head_weight[: CUTOFFS[0]])
    layer.cluster_weight.assign(head_weight[CUTOFFS[0] :])
    head_bias_values = theirs.head.bias.detach().numpy() if head_bias else np.zeros(CUTOFFS[0] + len(CUTOFFS))
    if head_bias:
        assert np.abs(head_bias_values).max() > 0
    layer.output_biases[0].assign(head_bias_values[: CUTOFFS[0]])
    layer.cluster_bias.assign(head_bias_values[CUTOFFS[0] :])
    layer.projections[0].assign(np.eye(8, dtype="float32"))
    for i, tail in enumerate(theirs.tail, start=1):
        layer.projections[i].assign(tail[0].weight.detach().numpy().T)
        layer.output_embeddings[i].assign(tail[1].weight.detach().numpy())
        layer.output_biases[i].assign(np.zeros(layer.output_biases[i].shape, "float32"))

    hidden = hidden_states(8)
    ours = numpy(layer(hidden))
    with torch.no_grad():
        expected = theirs.log_prob(torch.from_numpy(hidden.reshape(-1, 8))).numpy().reshape(2, 4, VOCABULARY)
    np.testing.assert_allclose(ours, expected, atol=1e-5)
    # And torch's per-target output (the loss path) agrees with our gather.
    with torch.no_grad():
        target_log_probs = theirs(torch.from_numpy(hidden.reshape(-1, 8)), torch.from_numpy(TARGETS.reshape(-1)).long())
    np.testing.assert_allclose(
        numpy(layer.token_log_probabilities(hidden, TARGETS)), target_log_probs.output.numpy().reshape(2, 4), atol=1e-5
    )


# --- against the transformers formulas, with projections and biases ------------

CASES = {
    # input_dim != embedding_dim: one table sliced per cluster, a projection per cluster.
    "div1_projected": dict(embedding_dim=8, input_dim=6, cutoffs=CUTOFFS, div_val=1),
    # input_dim == embedding_dim with div_val 1: no projections at all.
    "div1_unprojected": dict(embedding_dim=8, input_dim=8, cutoffs=CUTOFFS, div_val=1),
    "div2_projected": dict(embedding_dim=8, input_dim=6, cutoffs=CUTOFFS, div_val=2),
    "div2_one_cutoff": dict(embedding_dim=8, input_dim=8, cutoffs=(11,), div_val=2),
    "no_cutoffs_projected": dict(embedding_dim=8, input_dim=6, cutoffs=(), div_val=1),
    "no_cutoffs_plain": dict(embedding_dim=8, input_dim=8, cutoffs=(), div_val=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_transformers_formula(case):
    arguments = CASES[case]
    layer = AdaptiveLogSoftmax(VOCABULARY, **arguments)
    layer.build((None, arguments["input_dim"]))
    randomize(layer)
    hidden = hidden_states(arguments["input_dim"])
    log_probs = numpy(layer(hidden))
    assert log_probs.shape == (2, 4, VOCABULARY)
    np.testing.assert_allclose(log_probs, reference_of(layer, hidden), atol=1e-5)
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(
        numpy(layer.token_log_probabilities(hidden, TARGETS)),
        np.take_along_axis(log_probs, TARGETS[..., None], -1)[..., 0],
    )


def test_plain_log_softmax_without_cutoffs():
    layer = AdaptiveLogSoftmax(VOCABULARY, 8, input_dim=8)
    layer.build((None, 8))
    randomize(layer)
    assert layer.cluster_weight is None and layer.projections == [None]
    hidden = hidden_states(8)
    logits = hidden.astype("float64") @ numpy(layer.output_embeddings[0]).T + numpy(layer.output_biases[0])
    np.testing.assert_allclose(numpy(layer(hidden)), log_softmax(logits), atol=1e-5)


def test_weights_shapes_and_names():
    layer = AdaptiveLogSoftmax(VOCABULARY, 8, input_dim=6, cutoffs=CUTOFFS, div_val=2)
    layer.build((None, 6))
    assert tuple(layer.cluster_weight.shape) == (3, 8) and tuple(layer.cluster_bias.shape) == (3,)
    assert [tuple(t.shape) for t in layer.output_embeddings] == [(4, 8), (5, 4), (6, 2), (8, 1)]
    assert [tuple(b.shape) for b in layer.output_biases] == [(4,), (5,), (6,), (8,)]
    assert [tuple(p.shape) for p in layer.projections] == [(6, 8), (6, 4), (6, 2), (6, 1)]
    assert sorted(w.name for w in layer.weights) == sorted(
        ["cluster_weight", "cluster_bias"]
        + [f"{kind}_{i}" for kind in ("output_embeddings", "output_bias", "projection") for i in range(4)]
    )
    single = AdaptiveLogSoftmax(VOCABULARY, 8, input_dim=6, cutoffs=CUTOFFS, div_val=1)
    single.build((None, 6))
    assert [tuple(t.shape) for t in single.output_embeddings] == [(VOCABULARY, 8)]
    assert [tuple(b.shape) for b in single.output_biases] == [(VOCABULARY,)]
    assert [tuple(p.shape) for p in single.projections] == [(6, 8)] * 4
    assert single.compute_output_shape((2, 5, 6)) == (2, 5, VOCABULARY)
    with pytest.raises(ValueError, match="input_dim is 6"):
        AdaptiveLogSoftmax(VOCABULARY, 8, input_dim=6)(np.zeros((2, 8), "float32"))


# --- tying to an AdaptiveEmbedding ----------------------------------------------


def tied_pair(div_val, embedding_dim=8, model_dim=6, tie_projections=(False, True, True, True)):
    embedding = AdaptiveEmbedding(VOCABULARY, embedding_dim, output_dim=model_dim, cutoffs=CUTOFFS, div_val=div_val)
    softmax = AdaptiveLogSoftmax(
        VOCABULARY,
        embedding_dim,
        input_dim=model_dim,
        cutoffs=CUTOFFS,
        div_val=div_val,
        tied_embedding=embedding,
        tie_projections=list(tie_projections),
    )
    return embedding, softmax


@pytest.mark.parametrize("div_val", [1, 2])
def test_tied_tables_and_projections_are_the_embeddings(div_val):
    embedding, softmax = tied_pair(div_val)
    assert embedding.built  # by the softmax, outside its name scope
    assert all(w.path.startswith(embedding.name + "/") for w in embedding.weights)
    softmax.build((None, 6))
    assert len(softmax.output_embeddings) == len(embedding.embeddings) == (1 if div_val == 1 else 4)
    for ours, theirs in zip(softmax.output_embeddings, embedding.embeddings):
        assert ours is theirs
    # Only the untied head projection is the softmax's own.
    assert softmax.projections[0] is not None and softmax.projections[1:] == [None, None, None]
    own = {id(w) for w in softmax.weights} - {id(w) for w in embedding.weights}
    assert len(own) == 2 + len(softmax.output_biases) + 1
    assert not any("output_embeddings" in w.path for w in softmax.weights)

    randomize(softmax)  # also the tied embedding's variables
    hidden = hidden_states(6)
    # transformers: out_projs[i] = emb_projs[i] (emb_projs[0] when div_val == 1), applied
    # as h @ out_projs[i]; our embedding keeps emb_projs transposed, (d_i, d_model).
    embedding_projections = [numpy(p) for p in embedding.projections]
    kernels = [numpy(softmax.projections[0])] + [
        embedding_projections[0 if div_val == 1 else i].T for i in range(1, 4)
    ]
    np.testing.assert_allclose(numpy(softmax(hidden)), reference_of(softmax, hidden, kernels), atol=1e-5)


def test_tied_model_counts_every_variable_once_and_predicts():
    embedding, softmax = tied_pair(2)
    token_ids = keras.Input(shape=(None,), dtype="int32")
    hidden = keras.layers.Dense(6, name="mix")(embedding(token_ids))
    model = keras.Model(token_ids, softmax(hidden))
    randomize(model)
    # embedding: 4 tables + 4 projections; Dense: 2; softmax: cluster weight and bias,
    # 4 biases, the untied head projection.
    assert len(model.trainable_weights) == 8 + 2 + 7
    assert len({id(w) for w in model.trainable_weights}) == len(model.trainable_weights)
    batch = np.array([[0, 3, 4, 8, 9, 22], [14, 15, 16, 1, 2, 21]], "int32")
    predicted = model.predict(batch, verbose=0)
    np.testing.assert_allclose(predicted, numpy(model(batch)), atol=1e-5)
    np.testing.assert_allclose(np.exp(predicted).sum(-1), 1.0, atol=1e-5)


# The embedding's head projection is not used by the softmax (its own is): no gradient.
@pytest.mark.filterwarnings("ignore:Gradients do not exist:UserWarning")
def test_gradient_flows_to_the_tied_tables():
    embedding, softmax = tied_pair(2)
    hidden = keras.Input(shape=(6,))
    model = keras.Model(hidden, softmax(hidden))
    randomize(model)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=1.0),
        # The output is log-probabilities, so it is its own log-softmax.
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = [numpy(v) for v in embedding.weights]
    x = np.random.default_rng(2).standard_normal((8, 6)).astype("float32")
    model.train_on_batch(x, TARGETS.reshape(-1))
    for variable, old in zip(embedding.weights, before):
        if variable.name == "projection_0":  # the head's projection is the softmax's own
            np.testing.assert_array_equal(numpy(variable), old)
        else:
            assert np.abs(numpy(variable) - old).max() > 1e-6, variable.path


def test_float32_under_mixed_precision():
    embedding, softmax = tied_pair(2)
    softmax.build((None, 6))
    randomize(softmax)
    mixed_embedding = AdaptiveEmbedding(VOCABULARY, 8, 6, CUTOFFS, div_val=2, dtype="mixed_bfloat16")
    mixed = AdaptiveLogSoftmax(
        VOCABULARY, 8, 6, CUTOFFS, div_val=2, tied_embedding=mixed_embedding,
        tie_projections=[False, True, True, True], dtype="mixed_bfloat16",
    )
    mixed.build((None, 6))
    mixed_embedding.set_weights(embedding.get_weights())
    mixed.set_weights(softmax.get_weights())
    assert mixed.dtype_policy.name == "float32"
    hidden = hidden_states(6)
    output = mixed(hidden)
    assert keras.backend.standardize_dtype(output.dtype) == "float32"
    # bfloat16 anywhere (inputs, own or tied weights) would be off by ~1e-2.
    np.testing.assert_allclose(numpy(output), numpy(softmax(hidden)), atol=1e-5)


# --- serialization and arguments --------------------------------------------------


def test_config_round_trip():
    layer = AdaptiveLogSoftmax(VOCABULARY, 8, input_dim=6, cutoffs=CUTOFFS, div_val=2, name="crit")
    layer.build((None, 6))
    randomize(layer)
    config = layer.get_config()
    assert config["cutoffs"] == list(CUTOFFS) and config["div_val"] == 2 and config["input_dim"] == 6
    rebuilt = deserialize(serialize(layer))
    assert isinstance(rebuilt, AdaptiveLogSoftmax) and rebuilt.get_config() == config
    rebuilt.build((None, 6))
    rebuilt.set_weights(layer.get_weights())
    hidden = hidden_states(6)
    np.testing.assert_array_equal(numpy(rebuilt(hidden)), numpy(layer(hidden)))


def test_tied_layer_is_not_serializable_on_its_own():
    _, softmax = tied_pair(2)
    with pytest.raises(NotImplementedError, match="rebuilds it"):
        softmax.get_config()


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(cutoffs=(9, 4)), "strictly increasing"),
        (dict(cutoffs=(4, 4)), "strictly increasing"),
        (dict(cutoffs=(4, VOCABULARY)), "below vocabulary_size"),
        (dict(cutoffs=(4, 40)), "below vocabulary_size"),
        (dict(div_val=0), "div_val"),
        (dict(div_val=-2), "div_val"),
        (dict(cutoffs=(4, 9), tie_projections=[True, False]), "one boolean per cluster"),
        (dict(cutoffs=(4, 9), tie_projections=[False, True, True]), "needs a tied_embedding"),
        (dict(input_dim=0), "input_dim"),
    ],
)
def test_bad_arguments(arguments, message):
    arguments = {"vocabulary_size": VOCABULARY, "embedding_dim": 8, "input_dim": 6, **arguments}
    with pytest.raises(ValueError, match=message):
        AdaptiveLogSoftmax(**arguments)


@pytest.mark.parametrize(
    "embedding_arguments, message",
    [
        (dict(cutoffs=(4, 9)), "differ"),
        (dict(div_val=1), "differ"),
        (dict(embedding_dim=16), "differ"),
        (dict(output_dim=5), "output_dim"),
    ],
)
def test_tied_embedding_must_match(embedding_arguments, message):
    embedding = AdaptiveEmbedding(
        **{"vocabulary_size": VOCABULARY, "embedding_dim": 8, "output_dim": 6, "cutoffs": CUTOFFS, "div_val": 2,
           **embedding_arguments}
    )
    with pytest.raises(ValueError, match=message):
        AdaptiveLogSoftmax(
            VOCABULARY, 8, 6, CUTOFFS, div_val=2, tied_embedding=embedding, tie_projections=[True] * 4
        )


def test_tied_embedding_must_be_adaptive():
    with pytest.raises(ValueError, match="AdaptiveEmbedding"):
        AdaptiveLogSoftmax(VOCABULARY, 8, 8, tied_embedding=keras.layers.Embedding(VOCABULARY, 8))
