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

from attention_zoo_keras.backend_support import compile_step
from attention_zoo_keras.generation.beam_search import beam_search
from attention_zoo_keras.generation.beam_search import check_beam_options
from attention_zoo_keras.generation.in_place_decoding import decode_in_place
from attention_zoo_keras.generation.samplers import get_sampler
from attention_zoo_keras.generation.samplers import sampler_uniforms
from attention_zoo_keras.layers.tied_lm_head import TiedLMHead
from attention_zoo_keras.losses.smoothed_cross_entropy import SparseCategoricalCrossentropyWithLabelSmoothing
from attention_zoo_keras.models.generative_task import BUFFER_MULTIPLE
from attention_zoo_keras.models.generative_task import GenerativeTask
from attention_zoo_keras.models.generative_task import check_beam_sampler_options
from attention_zoo_keras.models.generative_task import right_padded
from attention_zoo_keras.models.generative_task import round_up
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.text_preprocessor import as_text_list
from attention_zoo_keras.models.transformer.transformer_backbone import TransformerBackbone
from attention_zoo_keras.models.transformer.transformer_preprocessor import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.registration import register

# Sources are padded to a multiple of this for generation, so that batches
# of similar lengths reuse one compiled program.
SOURCE_MULTIPLE = 16
_NEG = -1.0e9


@register
class TransformerSeq2SeqLM(GenerativeTask):
    """Translates (or otherwise maps) a source sequence to a target sequence.

    Args:
        backbone: a `TransformerBackbone`.
        preprocessor: a `TransformerSeq2SeqLMPreprocessor`, so that `fit`
            takes `(sources, targets)` text pairs and `generate` strings.
        logits_bias: add a learned bias over the target vocabulary to the
            logits (Marian's `final_logits_bias`; the paper has none).

    Inputs: the backbone's four features. Output: logits `(batch,
    target_length, target_vocabulary)` for the next target token at every
    decoder position.

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

    def __init__(self, backbone, preprocessor=None, logits_bias=False, **kwargs):
        inputs = dict(backbone.input)
        head = TiedLMHead(
            backbone.target_token_embedding, use_bias=logits_bias, dtype=backbone.dtype_policy, name="lm_head"
        )
        logits = head(backbone(inputs)["decoder_sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.lm_head = head
        self.logits_bias = logits_bias

    def get_config(self):
        return {**super().get_config(), "logits_bias": self.logits_bias}

    def default_compile_arguments(self):
        return {
            "optimizer": keras.optimizers.AdamW(5e-5, weight_decay=0.01),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    def compile(self, optimizer="auto", loss="auto", label_smoothing=0.0, **kwargs):
        """`Task.compile`, with `label_smoothing` (ε_ls, 0.1 in the paper) for
        the default loss: cross-entropy against `(1 − ε)·onehot(y) + ε/V`
        (`losses.SparseCategoricalCrossentropyWithLabelSmoothing`)."""
        if label_smoothing:
            if loss != "auto":
                raise ValueError("label_smoothing applies to the default loss; pass loss='auto' with it.")
            loss = SparseCategoricalCrossentropyWithLabelSmoothing(label_smoothing, from_logits=True)
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    # ------------------------------------------------------------------
    # Generation.

    def _sources(self, inputs):
        """`(encoder_token_ids, encoder_padding_mask, is_text, is_single)`:
        numpy arrays trimmed to the longest source (rounded up)."""
        if isinstance(inputs, dict):
            token_ids = np.asarray(ops.convert_to_numpy(inputs["encoder_token_ids"]))
            if "encoder_padding_mask" in inputs:
                mask = np.asarray(ops.convert_to_numpy(inputs["encoder_padding_mask"])).astype(bool)
            else:
                mask = np.ones(token_ids.shape, dtype=bool)
            if token_ids.ndim == 1:
                token_ids, mask = token_ids[None], mask[None]
            if token_ids.ndim != 2 or mask.shape != token_ids.shape:
                raise ValueError(
                    "encoder_token_ids and encoder_padding_mask must both be (batch, source_length); got the "
                    f"shapes {token_ids.shape} and {mask.shape}."
                )
            padding_before_a_token = (mask[:, 1:] & ~mask[:, :-1]).any(axis=1)
            if padding_before_a_token.any():
                raise ValueError(
                    f"Source {int(np.argmax(padding_before_a_token))}'s encoder_padding_mask is not right-padded "
                    "(real tokens first, then padding); generate takes right-padded sources."
                )
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
        if token_ids.shape[0] == 0:
            raise ValueError("generate needs at least one source; got an empty batch.")
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

    def _token_id(self, name, default):
        """A special id of the tokenizer (`pad_token_id`, `end_token_id`),
        or `default` without a preprocessor."""
        if self.preprocessor is None:
            return default
        return getattr(self.preprocessor.tokenizer, name)

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

    def generate(
        self,
        inputs,
        max_length=None,
        num_beams=1,
        length_penalty=1.0,
        early_stopping=False,
        sampler="greedy",
        seed=None,
        stop_token_ids="auto",
        decoder_start_token_id="auto",
        suppressed_token_ids="auto",
        force_end_token=True,
        **sampler_options,
    ):
        """Target sequences for sources, decoded token by token in one
        compiled loop.

        The encoder runs once; each decoder layer keeps a key/value cache
        of its self-attention that grows by one position a step, and the
        keys and values of its cross-attention, computed once from the
        encoder's output.

        Args:
            inputs: a string or a list of strings (with a preprocessor), or
                a dict of `encoder_token_ids` and `encoder_padding_mask`.
            max_length: the longest target, counting the decoder start
                token (as `transformers` counts); by default room for what
                training covers, the preprocessor's `decoder_sequence_length`
                plus one (at most the backbone's `max_sequence_length`).
            num_beams: above 1, beam search with this many beams (the
                paper's setting: 4, `length_penalty=0.6`).
            length_penalty: beam scores are `log p(y|x) / |y|^length_penalty`
                with `|y|` the generated tokens.
            early_stopping: beam search's stopping rule (`True`, `False` or
                `"never"`, as in `transformers`).
            sampler: with one beam, `"greedy"`, `"temperature"`, `"top_k"`,
                `"top_p"` or a `generation.Sampler`.
            seed: an int makes the random samplers reproducible.
            stop_token_ids: a row stops after emitting one of these; `"auto"`
                is `</s>`, `None` never stops early.
            decoder_start_token_id: the decoder's first input; `"auto"` is
                the preprocessor's (Marian: `<pad>`).
            suppressed_token_ids: ids never generated; `"auto"` is the pad
                id (the decoder start, for Marian). Their scores are set to
                −∞ after the log-softmax in beam search, before it
                otherwise, as `transformers`' `bad_words_ids` does.
            force_end_token: a row that reaches `max_length` ends with the
                first stop token (`transformers`' `forced_eos_token_id`,
                which Marian configs set).
            **sampler_options: the sampler's options (`temperature`, `k`, `p`).

        Returns:
            Strings for text input (a string for a single string);
            otherwise a dict of numpy `token_ids` and `padding_mask`
            `(batch, length)`, the decoder start token first.

        Example:

        >>> mt.generate("The cat sat on the mat.", num_beams=4, length_penalty=0.6)  # doctest: +SKIP
        """
        encoder_token_ids, encoder_padding_mask, is_text, is_single = self._sources(inputs)
        start_id, suppressed = self._special_ids(decoder_start_token_id, suppressed_token_ids)
        stop_ids = self._stop_token_ids(stop_token_ids)
        max_length = self._max_length(max_length)
        pad_id = self._token_id("pad_token_id", stop_ids[0] if stop_ids else 0)
        batch = encoder_token_ids.shape[0]
        buffer_length = round_up(max_length, BUFFER_MULTIPLE, self.backbone.max_sequence_length)
        token_ids, prompt_mask = right_padded([[start_id]] * batch, buffer_length, pad_id)
        end_positions = np.full((batch,), max_length, dtype="int32")
        forced_id = stop_ids[0] if (force_end_token and stop_ids) else -1
        rules = (suppressed, forced_id)
        if num_beams > 1 or sampler == "beam":
            check_beam_sampler_options(sampler_options)
            token_ids, valid = self._beam_generate(
                encoder_token_ids, encoder_padding_mask, token_ids, max_length, stop_ids, rules,
                num_beams, length_penalty, early_stopping,
            )
        else:
            sampler = get_sampler(sampler, **sampler_options)
            token_ids, valid = self._sample_generate(
                encoder_token_ids, encoder_padding_mask, token_ids, prompt_mask, end_positions, stop_ids, rules,
                pad_id, sampler, seed,
            )
        length = int(valid.any(axis=0).nonzero()[0].max()) + 1
        token_ids, valid = token_ids[:, :length], valid[:, :length]
        if not is_text:
            return {"token_ids": token_ids, "padding_mask": valid.astype("int32")}
        tokenizer = self.preprocessor.tokenizer
        texts = [tokenizer.decode(ids[mask][1:]) for ids, mask in zip(token_ids, valid)]
        return texts[0] if is_single else texts

    def _max_length(self, max_length):
        limit = self.backbone.max_sequence_length
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
        return int(max_length)

    def _decoding_state(self, encoder_token_ids, encoder_padding_mask, rows_per_source, buffer_length):
        """`(cross-attention keys and values per layer, empty self-attention
        caches)` for `rows_per_source` decoder rows per source (beams)."""
        backbone = self.backbone
        encoder_output = backbone.encode(encoder_token_ids, encoder_padding_mask)
        key_values = tuple(block.cross_attention.project_key_value(encoder_output) for block in backbone.decoder_layers)
        if rows_per_source > 1:
            key_values = keras.tree.map_structure(lambda t: ops.repeat(t, rows_per_source, axis=0), key_values)
        batch = ops.shape(encoder_token_ids)[0] * rows_per_source
        cache = tuple(block.self_attention.initial_cache(batch, buffer_length) for block in backbone.decoder_layers)
        return key_values, cache

    def _next_token_logits(self, token_column, cache, index, key_values, encoder_padding_mask, output_kernel):
        """The decoding step: logits `(batch, vocabulary)` after the tokens
        `(batch, 1)` at `index`, and the extended cache."""
        x, cache = self.backbone.decode(
            token_column, None, None, encoder_padding_mask, cache=cache, cache_update_index=index,
            encoder_key_values=key_values,
        )
        return self.lm_head(x[:, 0, :], output_kernel=output_kernel), cache

    @staticmethod
    def _apply_rules(scores, index, end_positions, rules):
        """Scores `(batch, vocabulary)` for the token after position `index`
        with the suppressed ids at −∞ and, where that token is the last a
        row may write (`index + 1 == end − 1`), every id but the forced end
        token at −∞ (and the end token at 0)."""
        suppressed, forced_id = rules
        vocabulary = ops.arange(ops.shape(scores)[-1])
        if suppressed:
            banned = ops.any(vocabulary[:, None] == ops.convert_to_tensor(list(suppressed))[None, :], axis=-1)
            scores = ops.where(banned[None, :], _NEG, scores)
        if forced_id >= 0:
            last = ops.equal(index + 1, end_positions - 1)[:, None]
            forced = ops.where(vocabulary == forced_id, 0.0, _NEG)[None, :]
            scores = ops.where(last, ops.cast(forced, scores.dtype), scores)
        return scores

    def _sample_generate(self, encoder_token_ids, encoder_padding_mask, token_ids, prompt_mask, end_positions,
                         stop_ids, rules, pad_id, sampler, seed):
        batch, buffer_length = token_ids.shape
        uniforms = sampler_uniforms(sampler, batch, buffer_length, int(end_positions.max()), seed)

        def build():
            step = compile_step(self._next_token_logits, self.variables)

            def run(encoder_token_ids, encoder_padding_mask, token_ids, prompt_mask, end_positions, stop_ids, uniforms):
                key_values, cache = self._decoding_state(encoder_token_ids, encoder_padding_mask, 1, buffer_length)

                def constrained_step(token_column, cache, index, *constants):
                    logits, cache = step(token_column, cache, index, *constants)
                    return self._apply_rules(ops.cast(logits, "float32"), index, end_positions, rules), cache

                return decode_in_place(
                    constrained_step, token_ids, prompt_mask, end_positions, stop_ids, uniforms, cache, 1,
                    sampler, pad_id,
                    constants=(key_values, encoder_padding_mask, self.lm_head.output_kernel(self.compute_dtype)),
                )

            return run

        key = ("sample", type(sampler).__name__, tuple(sampler.config().items()), pad_id, rules)
        token_ids, valid = self._compiled(key, build)(
            ops.convert_to_tensor(encoder_token_ids),
            ops.convert_to_tensor(encoder_padding_mask),
            ops.convert_to_tensor(token_ids),
            ops.convert_to_tensor(prompt_mask),
            ops.convert_to_tensor(end_positions),
            ops.convert_to_tensor(np.array(stop_ids or [-1], dtype="int32")),
            ops.convert_to_tensor(uniforms),
        )
        return np.asarray(ops.convert_to_numpy(token_ids)), np.asarray(ops.convert_to_numpy(valid))

    def _beam_generate(self, encoder_token_ids, encoder_padding_mask, token_ids, max_length, stop_ids, rules,
                       num_beams, length_penalty, early_stopping):
        num_beams, length_penalty, early_stopping = check_beam_options(num_beams, length_penalty, early_stopping)
        buffer_length = token_ids.shape[1]

        def build():
            step = compile_step(self._next_token_logits, self.variables)

            def run(encoder_token_ids, encoder_padding_mask, token_ids, max_length, stop_ids):
                key_values, cache = self._decoding_state(
                    encoder_token_ids, encoder_padding_mask, num_beams, buffer_length
                )
                rows = ops.shape(token_ids)[0] * num_beams
                end_positions = ops.broadcast_to(max_length, (rows,))

                def process(log_probs, index):
                    return self._apply_rules(log_probs, index, end_positions, rules)

                return beam_search(
                    step, token_ids, cache, 1, max_length, stop_ids, num_beams, length_penalty, early_stopping,
                    constants=(
                        key_values,
                        ops.repeat(encoder_padding_mask, num_beams, axis=0),
                        self.lm_head.output_kernel(self.compute_dtype),
                    ),
                    process_log_probs=process,
                )

            return run

        run = self._compiled(("beam", num_beams, length_penalty, early_stopping, rules), build)
        best, best_lengths = run(
            ops.convert_to_tensor(encoder_token_ids),
            ops.convert_to_tensor(encoder_padding_mask),
            ops.convert_to_tensor(token_ids),
            ops.convert_to_tensor(np.int32(max_length)),
            ops.convert_to_tensor(np.array(stop_ids or [-1], dtype="int32")),
        )
        best_lengths = np.asarray(ops.convert_to_numpy(best_lengths))
        valid = np.arange(buffer_length)[None, :] < best_lengths[:, None]
        return np.asarray(ops.convert_to_numpy(best)), valid
