"""Token samplers: the rule that turns next-token logits into a token id.

Every sampler is a pure function of `keras.ops` on

    choose(logits, uniform) -> token ids

with `logits` `(batch, vocabulary)` and `uniform` `(batch,)` numbers drawn
from U[0, 1) *before* decoding starts (with numpy, from the `seed`). A random
sampler draws by inverting the cumulative distribution of its (truncated,
tempered) probabilities at `uniform`:

    token = min{ i : Σ_{j ≤ i} p_j > u · Σ_j p_j }

which is an exact draw from `p`. Drawing the randomness up front keeps the
compiled decoding loop free of random-generator state (so it is a pure
function on every backend), makes a seed give the same draws on JAX,
TensorFlow and torch, and costs `batch × length` floats.

Samplers (names for `generate(sampler=...)`):

* `greedy`: `argmax` of the logits.
* `temperature`: a draw from `softmax(logits / T)`.
* `top_k` (Fan et al. 2018): a draw among the `k` most likely tokens.
* `top_p` (nucleus sampling, Holtzman et al. 2020, "The Curious Case of
  Neural Text Degeneration"): a draw from the smallest set of most likely
  tokens whose probability reaches `p`.
* `beam`: beam search, see `beam_search.py`; not a per-step rule.

`scored_choice(logits, uniform)` also returns each chosen token's
log-probability under the distribution it was drawn from (tempered and
truncated: `log_softmax` over the kept candidates), what `generate`
reports with `return_scores=True`.
"""

import inspect

import numpy as np
from keras import ops

from attention_zoo_keras.attention.masks import softmax_last_axis
from attention_zoo_keras.naming import NameRegistry


class Sampler:
    """A per-step decoding rule. Subclasses define `choose` (and, if they
    draw from another distribution than `softmax(logits)`,
    `scored_choice`)."""

    name = None
    is_random = False

    def choose(self, logits, uniform):
        """Token ids `(batch,)` int32 from `logits` `(batch, vocabulary)`."""
        raise NotImplementedError

    def scored_choice(self, logits, uniform):
        """`(token ids, log-probabilities)`, both `(batch,)`: `choose`'s
        tokens and their log-probabilities under the distribution they
        were drawn from (here `softmax(logits)`, as `transformers`'
        `compute_transition_scores(..., normalize_logits=True)` reports a
        greedy choice)."""
        tokens = self.choose(logits, uniform)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        return tokens, ops.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]

    def config(self):
        """The options that define this sampler (they key compiled loops)."""
        return {}

    def __repr__(self):
        options = ", ".join(f"{key}={value!r}" for key, value in self.config().items())
        return f"{type(self).__name__}({options})"


def _check_temperature(temperature):
    if not temperature > 0:
        raise ValueError(f"temperature must be positive; got {temperature}.")
    return float(temperature)


def _draw(logits, uniform, keep=None):
    """Index into `logits` `(batch, n)` drawn from their softmax, restricted
    to the positions where `keep` is true, by inverting the cumulative sum
    at `uniform` `(batch,)`."""
    probabilities = ops.softmax(ops.cast(logits, "float32"), axis=-1)
    if keep is not None:
        probabilities = ops.where(keep, probabilities, 0.0)
    cumulative = ops.cumsum(probabilities, axis=-1)
    threshold = ops.convert_to_tensor(uniform, "float32")[:, None] * cumulative[:, -1:]
    index = ops.sum(ops.cast(ops.less_equal(cumulative, threshold), "int32"), axis=-1)
    return ops.minimum(index, ops.shape(logits)[-1] - 1)


class DrawingSampler(Sampler):
    """A random sampler: a draw from the softmax of `candidates(logits)`,
    restricted to the candidates it keeps. Subclasses define
    `candidates`."""

    is_random = True

    def candidates(self, logits):
        """`(candidate_logits, candidate_ids, keep)` from `logits` `(batch,
        vocabulary)`: the (tempered) logits of the candidates `(batch, n)`,
        their token ids (`None`: the candidates are the vocabulary) and a
        bool mask of those kept (`None`: all)."""
        raise NotImplementedError

    def _draw_candidate(self, logits, uniform):
        candidate_logits, candidate_ids, keep = self.candidates(ops.cast(logits, "float32"))
        index = _draw(candidate_logits, uniform, keep)
        tokens = index if candidate_ids is None else ops.take_along_axis(candidate_ids, index[:, None], axis=-1)[:, 0]
        return ops.cast(tokens, "int32"), index, candidate_logits, keep

    def choose(self, logits, uniform):
        return self._draw_candidate(logits, uniform)[0]

    def scored_choice(self, logits, uniform):
        tokens, index, candidate_logits, keep = self._draw_candidate(logits, uniform)
        if keep is not None:
            candidate_logits = ops.where(keep, candidate_logits, float("-inf"))
        log_probs = ops.log_softmax(candidate_logits, axis=-1)
        return tokens, ops.take_along_axis(log_probs, index[:, None], axis=-1)[:, 0]


class GreedySampler(Sampler):
    """The most likely token: `argmax(logits)`.

    >>> import numpy as np
    >>> GreedySampler().choose(np.array([[0.1, 2.0, -1.0]]), np.zeros(1)).tolist()  # doctest: +SKIP
    [1]
    """

    name = "greedy"

    def choose(self, logits, uniform):
        return ops.cast(ops.argmax(logits, axis=-1), "int32")


class TemperatureSampler(DrawingSampler):
    """A draw from `softmax(logits / temperature)`.

    Args:
        temperature: float. Greater than 0; below 1 sharpens the
            distribution, above 1 flattens it.
    """

    name = "temperature"

    def __init__(self, temperature=1.0):
        self.temperature = _check_temperature(temperature)

    def candidates(self, logits):
        return logits / self.temperature, None, None

    def config(self):
        return {"temperature": self.temperature}


class TopKSampler(DrawingSampler):
    """A draw from `softmax(logits / temperature)` over the `k` most likely
    tokens only.

    Args:
        k: int. The number of candidates (`k=1` is greedy).
        temperature: float. Greater than 0.
    """

    name = "top_k"

    def __init__(self, k=50, temperature=1.0):
        if int(k) != k or k < 1:
            raise ValueError(f"top_k's k must be a positive integer; got {k}.")
        self.k = int(k)
        self.temperature = _check_temperature(temperature)

    def candidates(self, logits):
        top_logits, top_ids = ops.top_k(logits, k=min(self.k, ops.shape(logits)[-1]), sorted=True)
        return top_logits / self.temperature, top_ids, None

    def config(self):
        return {"k": self.k, "temperature": self.temperature}


class TopPSampler(DrawingSampler):
    """Nucleus sampling: a draw from `softmax(logits / temperature)` over the
    smallest set of most likely tokens whose total probability is at least
    `p` (the most likely token is always in it).

    Args:
        p: float. The nucleus' probability mass, in (0, 1].
        temperature: float. Greater than 0, applied before the nucleus is
            chosen (as in `transformers`).
        k: int or None. Optionally look only at the `k` most likely tokens
            first (faster than sorting the whole vocabulary; the nucleus is
            the same whenever it has fewer than `k` tokens).
    """

    name = "top_p"

    def __init__(self, p=0.9, temperature=1.0, k=None):
        if not 0 < p <= 1:
            raise ValueError(f"top_p's p must be in (0, 1]; got {p}.")
        if k is not None and (int(k) != k or k < 1):
            raise ValueError(f"top_p's k must be a positive integer or None; got {k}.")
        self.p = float(p)
        self.temperature = _check_temperature(temperature)
        self.k = None if k is None else int(k)

    def candidates(self, logits):
        vocabulary = ops.shape(logits)[-1]
        k = vocabulary if self.k is None else min(self.k, vocabulary)
        top_logits, top_ids = ops.top_k(logits, k=k, sorted=True)
        top_logits = top_logits / self.temperature
        probabilities = softmax_last_axis(top_logits)
        mass_before = ops.cumsum(probabilities, axis=-1) - probabilities
        return top_logits, top_ids, ops.less(mass_before, self.p)

    def config(self):
        return {"p": self.p, "temperature": self.temperature, "k": self.k}


def sampler_uniforms(sampler, batch, buffer_length, total_length, seed):
    """The numbers `choose` gets: `(batch, buffer_length)` float32, where
    position `t` of row `b` takes the uniform `[b, t]` of a `(batch,
    total_length)` array drawn from `seed` — the same draws whatever the
    buffer's rounding and the backend; zeros for a deterministic sampler."""
    uniforms = np.zeros((batch, buffer_length), dtype="float32")
    if sampler.is_random:
        uniforms[:, :total_length] = np.random.default_rng(seed).random((batch, total_length), dtype="float32")
    return uniforms


_SAMPLERS = NameRegistry(
    "sampler", "samplers", {cls.name: cls for cls in (GreedySampler, TemperatureSampler, TopKSampler, TopPSampler)}
)

# What the list of known samplers adds: the name `generate` runs as beam search.
_BEAM_NOTE = " (and beam, for generate's beam search)"


def sampler_names():
    """Names `generate(sampler=...)` accepts, `beam` included."""
    return sorted([*_SAMPLERS.names(), "beam"])


def sampler_option_names():
    """Every option some sampler takes (`temperature`, `k`, `p`): the
    keyword arguments `generate` passes on to the sampler."""
    classes = [_SAMPLERS.get(name) for name in _SAMPLERS.names()]
    return sorted({option for cls in classes for option in inspect.signature(cls).parameters})


def get_sampler(sampler, **options):
    """A `Sampler` from a name and its options, or `sampler` itself.

    Args:
        sampler: str or Sampler. A name from `sampler_names()` (but `beam`,
            which `generate` handles itself) or a `Sampler`.
        **options: dict. The sampler's constructor arguments
            (`temperature`, `k`, `p`).

    Raises:
        ValueError: an unknown name (listing the known ones) or an option
            the sampler does not take.

    >>> get_sampler("top_p", p=0.8)
    TopPSampler(p=0.8, temperature=1.0, k=None)
    """
    if isinstance(sampler, Sampler):
        if options:
            raise ValueError(
                f"Sampler options {sorted(options)} are given with a {type(sampler).__name__} "
                "instance; set them on the instance instead."
            )
        return sampler
    if not isinstance(sampler, str):
        raise ValueError(f"sampler must be a name ({', '.join(sampler_names())}) or a Sampler; got {sampler!r}.")
    cls = _SAMPLERS.get(sampler, note=_BEAM_NOTE)
    try:
        return cls(**options)
    except TypeError:
        accepted = [name for name in inspect.signature(cls).parameters]
        raise ValueError(
            f"Sampler '{sampler}' takes the options {accepted or 'none'}; got {sorted(options)}."
        ) from None
