"""The encoder-decoder Transformer with its output layer (Vaswani et al.,
2017): next-target-token logits from the decoder's states and the target
embedding matrix, shared with the output layer (§3.4),

    logits = D Eᵀ (+ b)

trained by teacher forcing on (source, target) pairs (with label smoothing,
§5.4) and decoded token by token, greedily, by sampling, or by beam search
with a length penalty (§6.1: beam 4, α = 0.6).
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.generation.cache_growth import layer_cache_growth
from attention_zoo_keras.layers.tied_lm_head import TiedLMHead
from attention_zoo_keras.losses.token_cross_entropy import token_cross_entropy
from attention_zoo_keras.models.generation_request import dict_prompt_arrays
from attention_zoo_keras.models.generation_request import new_token_counts
from attention_zoo_keras.models.generative_task import GenerativeTask
from attention_zoo_keras.models.generative_task import round_up
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.text_preprocessor import as_text_list
from attention_zoo_keras.models.transformer.transformer_backbone import TransformerBackbone
from attention_zoo_keras.models.transformer.transformer_seq2seq_lm_preprocessor import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register

# Sources are padded to a multiple of this for generation, so that batches
# of similar lengths reuse one compiled program.
SOURCE_MULTIPLE = 16
_NEG = -1.0e9


@register
class TransformerSeq2SeqLM(GenerativeTask):
    """Translates (or otherwise maps) a source sequence to a target sequence.

    Args:
        backbone: `TransformerBackbone`. The encoder-decoder.
        preprocessor: `TransformerSeq2SeqLMPreprocessor` or None. So that
            `fit` takes `(sources, targets)` text pairs and `generate`
            strings.
        logits_bias: bool. Add a learned bias over the target vocabulary to
            the logits (Marian's `final_logits_bias`; the paper has none).

    Inputs: the backbone's four features. Output: logits `(batch,
    target_length, target_vocabulary)` for the next target token at every
    decoder position.

    `generate` takes the arguments every generative task takes (see
    `GenerativeTask.generate`): the encoder runs once, then each decoder
    layer keeps a key/value cache of its self-attention and the keys and
    values of its cross-attention. `max_length` counts the decoder start
    token (as `transformers` counts); its default is room for what training
    covers, the preprocessor's `decoder_sequence_length` plus one (at most
    the backbone's `max_sequence_length`). Its own options:

    - `decoder_start_token_id`: the decoder's first input; `"auto"` is the
      preprocessor's (Marian: `<pad>`).
    - `suppressed_token_ids`: ids never generated; `"auto"` is the pad id
      (the decoder start, for Marian). Their scores are set to −∞ after the
      log-softmax in beam search, before it otherwise, as `transformers`'
      `bad_words_ids` does.
    - `force_end_token`: `True` (the default) ends a row that reaches
      `max_length` with the first stop token (`transformers`'
      `forced_eos_token_id`, which Marian configs set).

    The outputs start with the decoder start token; texts leave it out.

    Example:

    >>> mt = TransformerSeq2SeqLM.from_preset("transformer_opus_mt_en_de")          # doctest: +SKIP
    >>> mt.generate(["The cat sat on the mat."], num_beams=4, length_penalty=0.6)   # doctest: +SKIP
    >>> model = TransformerSeq2SeqLM(backbone=TransformerBackbone(...), preprocessor=...)  # doctest: +SKIP
    >>> model.compile(optimizer=azk.optimizers.transformer_schedule(hidden_dim=512),
    ...               label_smoothing=0.1)                                          # doctest: +SKIP
    >>> model.fit((sources, targets), epochs=10)                                    # doctest: +SKIP
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerSeq2SeqLMPreprocessor
    text_starts_at = 1  # the decoder start token is not text

    def __init__(self, backbone, preprocessor=None, logits_bias=False, **kwargs):
        inputs = dict(backbone.input)
        head = TiedLMHead(
            backbone.target_token_embedding, use_bias=logits_bias, dtype=backbone.dtype_policy, name="lm_head"
        )
        logits = head(backbone(inputs)["decoder_sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.lm_head = head
        self.logits_bias = logits_bias

    def validate_labels(self, labels, inputs=None):
        """Labels are next target-token ids, in the decoder's vocabulary."""
        check_id_range("labels", labels, self.backbone.decoder_vocabulary_size)

    def get_config(self):
        return {**super().get_config(), "logits_bias": self.logits_bias}

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(5e-5, weight_decay=0.01),
            "loss": token_cross_entropy(),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    def compile(self, optimizer="auto", loss="auto", label_smoothing=0.0, **kwargs):
        """`Task.compile`, with `label_smoothing` (ε_ls, 0.1 in the paper) for
        the default loss: cross-entropy against `(1 − ε)·onehot(y) + ε/V`
        (`losses.SparseCategoricalCrossentropyWithLabelSmoothing`)."""
        if label_smoothing:
            if loss != "auto":
                raise ValueError("label_smoothing applies to the default loss; pass loss='auto' with it.")
            loss = token_cross_entropy(label_smoothing)
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    # ------------------------------------------------------------------
    # Generation (`GenerativeTask.generate`, with the options of
    # `_prepare_generation`).

    @property
    def max_generation_length(self):
        """The decoder's number of positions."""
        return self.backbone.max_sequence_length

    def _sources(self, inputs):
        """`(encoder_token_ids, encoder_padding_mask, is_text, is_single)`:
        numpy arrays trimmed to the longest source (rounded up)."""
        if isinstance(inputs, dict):
            token_ids, mask = dict_prompt_arrays(inputs, "encoder_token_ids", "encoder_padding_mask", "Source")
            is_text, is_single = False, False
        else:
            if self.preprocessor is None or not self.preprocessor.is_raw(inputs) or isinstance(inputs, tuple):
                raise TypeError(
                    "generate takes source strings (with a preprocessor) or a dict of encoder_token_ids "
                    f"and encoder_padding_mask; got {type(inputs).__name__}."
                )
            texts = as_text_list(inputs)
            for row, text in enumerate(texts):
                if not text.strip():
                    raise ValueError(f"Source {row} is empty; there is nothing to translate.")
            features = self.preprocessor.pack_sources(texts)
            token_ids, mask = features["encoder_token_ids"], features["encoder_padding_mask"].astype(bool)
            is_text, is_single = True, isinstance(inputs, str)
        lengths = mask.sum(axis=1)
        if (lengths == 0).any():
            raise ValueError(f"Source {int(np.argmin(lengths))} is empty (its encoder_padding_mask is all 0).")
        check_id_range("encoder_token_ids", token_ids, self.backbone.vocabulary_size)
        limit = self.backbone.max_sequence_length
        if token_ids.shape[1] > limit and mask[:, limit:].any():
            raise ValueError(
                f"A source has {int(lengths.max())} tokens, more than the model's maximum sequence length {limit}."
            )
        # Never wider than the given arrays (round_up caps it there), so a cut, not a pad.
        width = round_up(int(lengths.max()), SOURCE_MULTIPLE, min(limit, token_ids.shape[1]))
        return token_ids[:, :width].astype("int32"), mask[:, :width].astype("int32"), is_text, is_single

    def _output_vocabulary_size(self):
        return self.backbone.decoder_vocabulary_size

    def _special_ids(self, decoder_start_token_id, suppressed_token_ids):
        """`(decoder start id, suppressed ids)` from the arguments of `generate`."""
        if decoder_start_token_id == "auto":
            if self.preprocessor is None:
                raise ValueError("Without a preprocessor, generate needs decoder_start_token_id.")
            decoder_start_token_id = self.preprocessor.decoder_start_token_id
        if isinstance(suppressed_token_ids, str):
            if suppressed_token_ids != "auto":
                raise ValueError(
                    f"suppressed_token_ids must be 'auto', None or a list of ids; got '{suppressed_token_ids}'."
                )
            suppressed_token_ids = [] if self.preprocessor is None else [self.preprocessor.tokenizer.pad_token_id]
        suppressed = tuple(int(i) for i in (suppressed_token_ids or ()))
        check_id_range("decoder_start_token_id", [int(decoder_start_token_id)], self.backbone.decoder_vocabulary_size)
        check_id_range("suppressed_token_ids", list(suppressed), self.backbone.decoder_vocabulary_size)
        return int(decoder_start_token_id), suppressed

    def _prepare_generation(
        self,
        inputs,
        max_length,
        max_new_tokens,
        stop_ids,
        *,
        decoder_start_token_id="auto",
        suppressed_token_ids="auto",
        force_end_token=True,
    ):
        """One decoder start token per source, each row ending at
        `max_length`; the sources are the request's `conditioning`, and the
        suppressed and forced ids its `rules` (see the class docstring for
        the options)."""
        encoder_token_ids, encoder_padding_mask, is_text, is_single = self._sources(inputs)
        start_id, suppressed = self._special_ids(decoder_start_token_id, suppressed_token_ids)
        if not isinstance(force_end_token, bool):
            raise TypeError(f"force_end_token must be True or False; got {force_end_token!r}.")
        end_positions = self._end_positions(max_length, max_new_tokens, encoder_token_ids.shape[0])
        pad_id = stop_ids[0] if stop_ids else 0
        if self.preprocessor is not None:
            pad_id = self.preprocessor.tokenizer.pad_token_id
        batch = encoder_token_ids.shape[0]
        forced_id = stop_ids[0] if (force_end_token and stop_ids) else -1
        return self._request(
            [[start_id]] * batch, end_positions, stop_ids, pad_id, is_text=is_text,
            is_single=is_single, conditioning=(encoder_token_ids, encoder_padding_mask), rules=(suppressed, forced_id),
        )

    def _end_positions(self, max_length, max_new_tokens, batch):
        """Each target's length `(batch,)`, counting the decoder start token:
        `max_length`, `max_new_tokens + 1`, or by default room for what
        training covers."""
        limit = self.backbone.max_sequence_length
        if max_new_tokens is not None:
            counts = new_token_counts(max_new_tokens, batch)
            if counts.min() < 1:
                raise ValueError(f"max_new_tokens must be at least 1 for a target token; got {int(counts.min())}.")
            if counts.max() + 1 > limit:
                raise ValueError(
                    f"max_new_tokens {int(counts.max())} (after the decoder start token) exceeds the model's "
                    f"max_sequence_length {limit}: the decoder has no positions beyond it."
                )
            return counts + 1
        if max_length is None:
            max_length = limit
            if self.preprocessor is not None:
                # The start token, then the targets training saw (up to
                # `decoder_sequence_length − 1` tokens) and `</s>`.
                max_length = min(limit, self.preprocessor.decoder_sequence_length + 1)
        if max_length < 2:
            raise ValueError(f"max_length {max_length} leaves no room for a token after the decoder start token.")
        if max_length > limit:
            raise ValueError(
                f"max_length {max_length} is longer than the model's max_sequence_length {limit}: "
                "the decoder has no positions beyond it."
            )
        return np.full((batch,), int(max_length))

    def _decoding_inputs(self, request, rows, buffer_length, prompt_length):
        """The sources of `rows`."""
        encoder_token_ids, encoder_padding_mask = request.conditioning
        return encoder_token_ids[rows], encoder_padding_mask[rows]

    def _start_decoding(self, inputs, token_ids, start_index, num_beams):
        """Runs the encoder once: each decoder layer's cross-attention keys
        and values (repeated for `num_beams` rows per source) and empty
        self-attention caches, with the output matrix laid out once.

        The sources are right-padded (`_sources` checks): where the backbone
        attends by key lengths (its encoder moves padding last, under JAX),
        the cross-attention is given each source's length instead of its
        padding mask."""
        encoder_token_ids, encoder_padding_mask = inputs
        backbone = self.backbone
        encoder_output = backbone.encode(encoder_token_ids, encoder_padding_mask)
        key_values = tuple(block.cross_attention.project_key_value(encoder_output) for block in backbone.decoder_layers)
        source_keys = encoder_padding_mask
        if self._sources_by_length():
            source_keys = ops.sum(ops.cast(ops.cast(encoder_padding_mask, "bool"), "int32"), axis=1)
        if num_beams > 1:
            key_values = keras.tree.map_structure(lambda t: ops.repeat(t, num_beams, axis=0), key_values)
            source_keys = ops.repeat(source_keys, num_beams, axis=0)
        batch = ops.shape(encoder_token_ids)[0] * num_beams
        cache = tuple(
            block.self_attention.initial_cache(batch, token_ids.shape[1]) for block in backbone.decoder_layers
        )
        return cache, (key_values, source_keys, self.lm_head.output_kernel(self.compute_dtype))

    def _cache_growth(self):
        """The decoder's self-attention caches, each grown by its mechanism;
        a step reads the decoder's weights and the output matrix, not the
        encoder's."""
        decoder_layers = self.backbone.decoder_layers
        step_weights = [weight for block in decoder_layers for weight in block.weights]
        return layer_cache_growth(
            [block.self_attention for block in decoder_layers], step_weights + self.lm_head.weights
        )

    def _start_index_bound(self, inputs, token_ids):
        """1: the loop starts after the decoder start token, and the
        self-attention caches start empty."""
        return 1

    def _sources_by_length(self):
        """Whether the decoding steps' cross-attention is given the sources'
        lengths instead of their padding mask: where the backbone's encoder
        moves padding last (under JAX; see `_start_decoding`)."""
        return self.backbone.encoder_padding_last is not None

    def _next_token_logits(self, token_column, cache, index, key_values, source_keys, output_kernel):
        """The decoding step: logits `(batch, vocabulary)` after the tokens
        `(batch, 1)` at `index`, and the extended cache; `source_keys`: the
        sources' padding mask `(batch, source_length)`, or their lengths
        `(batch,)` (see `_start_decoding`)."""
        by_length = self._sources_by_length()
        x, cache = self.backbone.decode(
            token_column, None, None, None if by_length else source_keys, cache=cache,
            cache_update_index=index, encoder_key_values=key_values,
            encoder_key_lengths=source_keys if by_length else None,
        )
        return self.lm_head(x[:, 0, :], output_kernel=output_kernel), cache

    def _score_processor(self, rules):
        """`_apply_rules` with the request's suppressed and forced ids."""
        return lambda scores, history: self._apply_rules(scores, history, rules)

    @staticmethod
    def _apply_rules(scores, history, rules):
        """Scores `(batch, vocabulary)` for the token after position
        `history.last_index` with the suppressed ids at −∞ and, where that
        token is the last a row may write (`last_index + 1 == end − 1`),
        every id but the forced end token at −∞ (and the end token at 0)."""
        suppressed, forced_id = rules
        if suppressed:
            scores = backend_support.fill_columns(scores, list(suppressed), _NEG)
        if forced_id >= 0:
            last = ops.equal(history.last_index + 1, history.end_positions - 1)[:, None]

            def forced_end(scores):
                vocabulary = ops.arange(ops.shape(scores)[-1])
                forced = ops.where(vocabulary == forced_id, 0.0, _NEG)[None, :]
                return ops.where(last, ops.cast(forced, scores.dtype), scores)

            # Only the last step of a row forces; the other steps skip the pass over every score.
            scores = backend_support.apply_when(ops.any(last), forced_end, scores)
        return scores
