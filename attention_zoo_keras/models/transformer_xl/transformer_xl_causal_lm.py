"""Transformer-XL with its adaptive softmax head (Dai et al., 2019):
log-probabilities of the next token at every position, the memory carried
from segment to segment.

    log p(x_{t+1} | x_≤t, memory) = AdaptiveLogSoftmax(h_t)

Training and evaluation read one long token stream in order
(`TransformerXLCausalLMPreprocessor`): each batch continues the rows of the
previous one, and the memory its forward pass produced is kept in a
non-trainable variable (without gradient) for the next batch — so `fit`
and `evaluate` work unchanged on every backend. Generation keeps the memory
as a key/value cache: in Transformer-XL keys and values carry no position
(positions enter through the queries' relative term), so caching the
projections of the remembered hidden states is the same computation as
re-projecting them at every step, only cheaper.
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.attention.xl import xl_attention_mask
from attention_zoo_keras.backend_support import is_concrete
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.layers.adaptive_softmax import AdaptiveLogSoftmax
from attention_zoo_keras.losses.token_cross_entropy import token_cross_entropy
from attention_zoo_keras.metrics.perplexity import Perplexity
from attention_zoo_keras.models.causal_lm import CausalLM
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.task import validation_split_index
from attention_zoo_keras.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from attention_zoo_keras.models.transformer_xl.transformer_xl_backbone import distance_encodings
from attention_zoo_keras.models.transformer_xl.transformer_xl_causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from attention_zoo_keras.models.transformer_xl.transformer_xl_causal_lm_preprocessor import stream_segments
from attention_zoo_keras.models.transformer_xl.transformer_xl_stream_memory import ReadStreamMemory
from attention_zoo_keras.models.transformer_xl.transformer_xl_stream_memory import StreamMemory
from attention_zoo_keras.models.transformer_xl.transformer_xl_stream_memory import WriteStreamMemory
from attention_zoo_keras.optimizers.fused_adam import FusedAdam
from attention_zoo_keras.registration import register

DEFAULT_STREAM_BATCH_SIZE = 8


def _is_token_stream(x):
    """Whether `x` is a 1-D array or list of ints."""
    if isinstance(x, (list, tuple)):
        return len(x) > 0 and all(isinstance(item, (int, np.integer)) for item in x)
    if isinstance(x, np.ndarray) or (is_concrete(x) and hasattr(x, "shape") and not isinstance(x, dict)):
        array = np.asarray(ops.convert_to_numpy(x))
        return array.ndim == 1 and array.dtype.kind in ("i", "u")
    return False


@register
class TransformerXLCausalLM(CausalLM):
    """Predicts the next token at every position, over any context length.

    Args:
        backbone: `TransformerXLBackbone`. The decoder.
        preprocessor: `TransformerXLCausalLMPreprocessor` or None. So `fit`,
            `evaluate` and `generate` take raw text.
        tie_embeddings: bool. The softmax's cluster tables are the adaptive
            input embedding's (the paper's WikiText-103 model).
        tie_projections: list of bool or None. Per cluster, whether its
            softmax projection is the input embedding's; `None`: all but the
            first with `tie_embeddings` (`tie_projs` of the WikiText-103
            model), none without.

    Inputs: a dict of `token_ids` `(batch, length)` and optionally
    `reset_memory` `(batch,)` bool, or the `token_ids` alone (a 2-D array;
    a 1-D one is a token stream, below). Output: log-probabilities `(batch,
    length, vocabulary_size)` in float32. Each call continues the memory of
    the previous one (rows marked `reset_memory` start afresh); `fit`,
    `evaluate` and `predict` on raw text or a 1-D token stream cut it into
    ordered segments (see `TransformerXLCausalLMPreprocessor`), so the
    default `batch_size` there (8) is the number of parallel streams.
    `score` runs one segment with an explicit memory instead. `generate`
    takes the arguments of every generative task (see
    `GenerativeTask.generate`); it needs `max_length` or `max_new_tokens`
    without a preprocessor (the model has no length limit).

    Example:

    >>> lm = TransformerXLCausalLM.from_preset("transformer_xl_wt103")     # doctest: +SKIP
    >>> lm.evaluate(wikitext_test_lines, batch_size=1)                     # doctest: +SKIP
    >>> lm.generate("The history of", max_length=200)                      # doctest: +SKIP
    >>> lm.fit(training_lines, epochs=1)                                   # doctest: +SKIP
    """

    backbone_cls = TransformerXLBackbone
    preprocessor_cls = TransformerXLCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, tie_embeddings=True, tie_projections=None, **kwargs):
        num_clusters = len(backbone.cutoffs) + 1
        if tie_projections is None:
            tie_projections = [False] + [True] * (num_clusters - 1) if tie_embeddings else [False] * num_clusters
        tie_projections = [bool(tie) for tie in tie_projections]

        # === Layers ===
        head = AdaptiveLogSoftmax(
            backbone.vocabulary_size,
            backbone.embedding_dim,
            backbone.hidden_dim,
            cutoffs=backbone.cutoffs,
            div_val=backbone.div_val,
            tied_embedding=backbone.token_embedding if tie_embeddings else None,
            tie_projections=tie_projections,
            dtype=backbone.dtype_policy,
            name="lm_head",
        )

        def streams():
            return getattr(self, "_stream_memory", ())

        read_memory = ReadStreamMemory(
            streams, backbone.num_layers, backbone.mem_len, backbone.hidden_dim,
            dtype=backbone.dtype_policy, name="read_memory",
        )
        # float32: it passes the float32 log-probabilities through, which a
        # (global) mixed policy's compute dtype would round.
        write_memory = WriteStreamMemory(streams, dtype="float32", name="write_memory")

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        reset_memory = keras.Input(shape=(), dtype="bool", name="reset_memory", optional=True)
        outputs = backbone({"token_ids": token_ids, "memory": read_memory(token_ids, reset_memory)})
        log_probabilities = write_memory(head(outputs["sequence_output"]), outputs["memory"])
        super().__init__(
            inputs={"token_ids": token_ids, "reset_memory": reset_memory},
            outputs=log_probabilities,
            backbone=backbone,
            preprocessor=preprocessor,
            **kwargs,
        )
        self.lm_head = head

        # === Config ===
        self.tie_embeddings = tie_embeddings
        self.tie_projections = tie_projections
        self._stream_memory = []

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdam(2.5e-4, clipnorm=0.25),
            "loss": token_cross_entropy(),
            "weighted_metrics": [Perplexity()],
        }

    # ------------------------------------------------------------------
    # The memory carried across batches.

    @property
    def unsaved_variables(self):
        """The stream memory: run-time state, never saved with the weights."""
        return [layer.memory for layer in self._stream_memory]

    def _saved_weights(self):
        return list(variables_by_key(self).values())  # (in `weights`' order, less `unsaved_variables`)

    def get_weights(self):
        """The weights as numpy arrays, less the stream memory (run-time
        state, as in saving), so that `set_weights` of a fresh model takes
        them."""
        return [ops.convert_to_numpy(variable) for variable in self._saved_weights()]

    def set_weights(self, weights):
        """Sets the weights `get_weights` returns (the stream memory is left
        as it is).

        Raises:
            ValueError: for a list of another length, or an array whose
                shape is not its variable's (both named).
        """
        variables = self._saved_weights()
        if len(variables) != len(weights):
            raise ValueError(
                f"{type(self).__name__}.set_weights takes {len(variables)} arrays (the weights less the stream "
                f"memory, as get_weights returns them); got {len(weights)}."
            )
        for variable, value in zip(variables, weights):
            if tuple(variable.shape) != tuple(np.shape(value)):
                raise ValueError(
                    f"set_weights: the variable '{variable.path}' has the shape {tuple(variable.shape)}; got an array "
                    f"of the shape {tuple(np.shape(value))}."
                )
        for variable, value in zip(variables, weights):
            variable.assign(value)

    def reset_memory(self, batch_size=None):
        """Zeros the memory carried between calls, for `batch_size` parallel
        streams (by default the current number, or 8). Called by `fit`,
        `evaluate` and `predict` on raw text with their `batch_size`."""
        if self._stream_memory and batch_size in (None, self._stream_memory[0].batch_size):
            variable = self._stream_memory[0].memory
            variable.assign(ops.zeros(variable.shape, variable.dtype))
            return
        backbone = self.backbone
        memory = StreamMemory(
            batch_size or DEFAULT_STREAM_BATCH_SIZE, backbone.num_layers, backbone.mem_len, backbone.hidden_dim,
            name="stream_memory",
        )
        memory.build()
        # The memory's shape follows the batch size, so a new batch size
        # replaces the variable; Keras locks a built model's state, so the
        # swap unlocks it briefly and drops the functions traced for the old one.
        was_locked = self._tracker.locked
        self._tracker.unlock()
        while self._stream_memory:
            self._stream_memory.pop()
        self._stream_memory.append(memory)
        if was_locked:
            self._tracker.lock()
        self.train_function = self.test_function = self.predict_function = None

    def score(self, token_ids, memory=None, training=False):
        """One segment with an explicit memory.

        Args:
            token_ids: int tensor of shape `(batch, length)`. The segment.
            memory: tensor of shape `(batch, num_layers, memory_length,
                hidden_dim)` or None. From the previous segment; `None`
                starts from `mem_len` zero vectors (as `transformers` does;
                pass `backbone.initial_memory(batch, 0)` for the authors'
                empty memory).
            training: bool. Dropout on or off.

        Returns:
            A dict of `log_probabilities` `(batch, length, vocabulary)`,
            `sequence_output` `(batch, length, hidden_dim)` and `memory`,
            the next segment's.
        """
        token_ids = ops.convert_to_tensor(token_ids, "int32")
        if memory is None:
            memory = self.backbone.initial_memory(ops.shape(token_ids)[0])
        memory = ops.convert_to_tensor(memory, self.backbone.compute_dtype)
        outputs = self.backbone({"token_ids": token_ids, "memory": memory}, training=training)
        return {
            "log_probabilities": self.lm_head(outputs["sequence_output"]),
            "sequence_output": outputs["sequence_output"],
            "memory": outputs["memory"],
        }

    def validate_inputs(self, inputs):
        check_id_range("token_ids", inputs["token_ids"], self.backbone.vocabulary_size)

    # ------------------------------------------------------------------
    # Raw text and token streams: ordered segments.

    @property
    def segment_length(self):
        """Inputs per segment for raw streams: the preprocessor's
        `sequence_length`, else the memory length."""
        return self.preprocessor.sequence_length if self.preprocessor is not None else self.backbone.mem_len

    def _stream(self, x):
        """The 1-D token stream of raw text or ids `x`, or `None` for other inputs."""
        if self.preprocessor is not None and self.preprocessor.is_raw(x):
            return self.preprocessor.stream(x)
        if _is_token_stream(x):
            return np.asarray(ops.convert_to_numpy(x) if not isinstance(x, (list, tuple)) else x, dtype="int32")
        return None

    def _as_dataset(self, x, y, sample_weight, batch_size, shuffle):
        stream = self._stream(x)
        if stream is None:
            return super()._as_dataset(x, y, sample_weight, batch_size, shuffle)
        if y is not None or sample_weight is not None:
            raise ValueError("A token stream's labels are its next tokens; pass only the text or the ids.")
        batch_size = batch_size or DEFAULT_STREAM_BATCH_SIZE
        features, labels, weights = self._segments(stream, batch_size)
        self.reset_memory(batch_size)
        return features, labels, weights, batch_size

    def _segments(self, stream, batch_size):
        """`stream_segments` of a token stream, its ids checked."""
        check_id_range("token_ids", stream, self.backbone.vocabulary_size)
        pad_id = self.preprocessor.tokenizer.end_token_id if self.preprocessor is not None else 0
        return stream_segments(stream, batch_size, self.segment_length, pad_id)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, sample_weight=None, shuffle=True, validation_data=None,
            validation_split=0.0, **kwargs):
        """`keras.Model.fit`; raw text or a 1-D token stream is read in
        order as `batch_size` parallel streams (never shuffled), the memory
        carried from batch to batch and reset at each epoch's start.

        With such a stream, `validation_split` holds out the stream's last
        fraction of tokens, and `validation_data` may be a stream too (raw
        text or ids): either is read as its own ordered segments, in
        `batch_size` parallel rows, the memory reset at its start.

        Example:

        >>> lm.fit(stream, batch_size=8, epochs=3, validation_split=0.1)  # doctest: +SKIP
        """
        stream = self._stream(x)
        if stream is not None:
            shuffle = False
            if validation_split and validation_data is None:
                split_at = validation_split_index(len(stream), validation_split)  # the stream's tail held out
                x, validation_data, validation_split = stream[:split_at], stream[split_at:], 0.0
            validation_stream = None if validation_data is None else self._stream(validation_data)
            if validation_stream is not None:
                try:
                    validation_data = self._segments(validation_stream, batch_size or DEFAULT_STREAM_BATCH_SIZE)
                except ValueError as error:
                    raise ValueError(f"The validation stream cannot be read in segments: {error}") from None
        return super().fit(
            x, y, batch_size=batch_size, epochs=epochs, sample_weight=sample_weight, shuffle=shuffle,
            validation_data=validation_data, validation_split=validation_split, **kwargs
        )

    # ------------------------------------------------------------------
    # Generation: the memory as a key/value cache.

    @property
    def attention_span(self):
        """How many positions a generated token attends to: `mem_len` with
        `same_length` (every query sees `mem_len` keys), else the memory
        and the token itself, `mem_len + 1` — as when tokens are fed one at
        a time with the memory (each position, prompt included)."""
        backbone = self.backbone
        return backbone.mem_len if backbone.same_length else backbone.mem_len + 1

    def _cache_growth(self):
        """None: the cache keeps the buffer's size, which the position keys
        (`_decoding_constants`) and the attention window are laid out for."""
        return None

    def _decoding_constants(self, buffer_length):
        """Each block's position keys for the distances a query can meet,
        `0 … min(buffer, span, clamp_len + 1) − 1`, projected once."""
        backbone = self.backbone
        num_distances = min(buffer_length, self.attention_span)
        if backbone.clamp_len > 0:
            num_distances = min(num_distances, backbone.clamp_len + 1)
        encodings = ops.cast(
            distance_encodings(num_distances, backbone.hidden_dim, backbone.clamp_len), backbone.compute_dtype
        )
        return tuple(block.position_keys(encodings) for block in backbone.transformer_layers)

    def _decoder_pass(self, token_ids, cache, cache_update_index, padding_mask=None, constants=()):
        """The blocks over new tokens at `cache_update_index …`, each
        attending over the last `attention_span` positions of its cache."""
        backbone = self.backbone
        x = backbone.token_embedding(token_ids)
        buffer_length = ops.shape(cache[0][0])[1]
        window = xl_attention_mask(
            ops.shape(token_ids)[1], buffer_length, attention_span=self.attention_span, query_offset=cache_update_index
        )[None]
        biases = None if backbone.shared_biases is None else backbone.shared_biases(x)
        caches = []
        for block, layer_cache, position_keys in zip(backbone.transformer_layers, cache, constants):
            x, layer_cache = block(
                x, attention_mask=window, shared_biases=biases, cache=layer_cache,
                cache_update_index=cache_update_index, position_keys=position_keys,
            )
            caches.append(layer_cache)
        return x, tuple(caches)

    def _next_token_logits(self, token_column, cache, index, *position_keys):
        """The decoding step: log-probabilities `(batch, vocabulary)` after
        the tokens `(batch, 1)` at `index`, and the extended cache."""
        x, cache = self._decoder_pass(token_column, cache, index, constants=position_keys)
        return self.lm_head(x[:, 0, :]), cache

    def get_config(self):
        config = super().get_config()
        config.update({"tie_embeddings": self.tie_embeddings, "tie_projections": self.tie_projections})
        return config
