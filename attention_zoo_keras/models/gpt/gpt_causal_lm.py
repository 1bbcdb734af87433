"""GPT-2 with its language-model head: next-token logits from the hidden
states and the (tied) token embedding matrix,

    logits = H Eᵀ     (no bias)
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.models.gpt.gpt_backbone import GPTBackbone
from attention_zoo_keras.models.gpt.gpt_preprocessor import GPTCausalLMPreprocessor
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.text_preprocessor import as_text_list
from attention_zoo_keras.registration import register


class TiedLMHead(keras.layers.Layer):
    """Vocabulary logits `h Eᵀ` with `E` the backbone's token embedding
    matrix (shared, so this layer owns no weights).

    Args:
        token_embedding: the backbone's `keras.layers.Embedding`.
    """

    def __init__(self, token_embedding, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding

    def call(self, hidden):
        embeddings = ops.cast(self.token_embedding.embeddings, hidden.dtype)
        return ops.matmul(hidden, ops.transpose(embeddings))

    def compute_output_shape(self, hidden_shape):
        return tuple(hidden_shape[:-1]) + (self.token_embedding.input_dim,)


@register
class GPTCausalLM(Task):
    """Predicts the next token at every position.

    Args:
        backbone: a `GPTBackbone`.
        preprocessor: a `GPTCausalLMPreprocessor` (so `fit` takes raw text).

    Inputs: the backbone's `token_ids` and `padding_mask`. Output: logits
    `(batch, length, vocabulary_size)`, float32 only if the backbone is.

    Example:

    >>> lm = GPTCausalLM.from_preset("gpt2")                        # doctest: +SKIP
    >>> lm.fit(["some text to continue pretraining on"], epochs=1)  # doctest: +SKIP
    >>> lm.generate("The meaning of life is", max_new_tokens=8)     # doctest: +SKIP
    """

    backbone_cls = GPTBackbone
    preprocessor_cls = GPTCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        inputs = dict(backbone.input)
        head = TiedLMHead(backbone.token_embedding, dtype=backbone.dtype_policy, name="lm_head")
        logits = head(backbone(inputs)["sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.lm_head = head

    def default_compile_arguments(self):
        return {
            "optimizer": keras.optimizers.AdamW(5e-5, weight_decay=0.01),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    # ------------------------------------------------------------------
    # Incremental decoding.

    def init_cache(self, batch_size, max_length):
        """An empty key/value cache `(batch, num_layers, 2, max_length,
        num_heads, head_dim)` in the backbone's compute dtype."""
        backbone = self.backbone
        head_dim = backbone.hidden_dim // backbone.num_heads
        shape = (batch_size, backbone.num_layers, 2, max_length, backbone.num_heads, head_dim)
        return ops.zeros(shape, dtype=backbone.compute_dtype)

    def call_with_cache(self, token_ids, cache, cache_update_index, padding_mask=None):
        """One forward pass over new tokens, reusing and extending `cache`.

        Args:
            token_ids: `(batch, new_length)` ids at positions
                `cache_update_index, …, cache_update_index + new_length − 1`.
            cache: `(batch, num_layers, 2, max_length, num_heads, head_dim)`,
                e.g. from `init_cache`.
            cache_update_index: position of the first new token.
            padding_mask: optional `(batch, max_length)`, true where a cache
                position holds a real token (attention is causal anyway, so
                right-padded prompts need none).

        Returns:
            `(logits, hidden, cache)`: logits `(batch, new_length, vocab)`,
            the final hidden states `(batch, new_length, hidden_dim)` and
            the updated cache.
        """
        backbone = self.backbone
        x = backbone.token_embedding(token_ids)
        x = x + backbone.position_embedding(token_ids, start_index=cache_update_index)
        attention_mask = None
        if padding_mask is not None:
            attention_mask = ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)
        caches = []
        for index, block in enumerate(backbone.transformer_layers):
            x, layer_cache = block(
                x,
                attention_mask=attention_mask,
                cache=cache[:, index, ...],
                cache_update_index=cache_update_index,
            )
            caches.append(layer_cache)
        hidden = backbone.final_norm(x)
        logits = self.lm_head(hidden)
        return logits, hidden, ops.stack(caches, axis=1)

    def _prompts(self, inputs):
        """`(list of id lists, is_text, is_single)` from raw text or a dict."""
        preprocessor = self.preprocessor
        if isinstance(inputs, dict):
            token_ids = np.asarray(ops.convert_to_numpy(inputs["token_ids"]))
            if "padding_mask" in inputs:
                mask = np.asarray(ops.convert_to_numpy(inputs["padding_mask"])).astype(bool)
            else:
                mask = np.ones(token_ids.shape, dtype=bool)
            if token_ids.ndim == 1:
                token_ids, mask = token_ids[None], mask[None]
            prompts = []
            for row, (ids, valid) in enumerate(zip(token_ids, mask)):
                length = int(valid.sum())
                if not valid[:length].all():
                    raise ValueError(
                        f"Prompt {row}'s padding_mask is not right-padded (real tokens first, "
                        "then padding); generate takes right-padded prompts."
                    )
                prompts.append([int(i) for i in ids[:length]])
            return prompts, False, False
        if preprocessor is None or not preprocessor.is_raw(inputs):
            raise TypeError(
                "generate takes raw strings (with a preprocessor) or a dict of token_ids and "
                f"padding_mask; got {type(inputs).__name__}."
            )
        prompts = preprocessor.tokenizer.encode(as_text_list(inputs))
        return prompts, True, isinstance(inputs, str)

    def _stop_token_ids(self, stop_token_ids):
        if isinstance(stop_token_ids, str):
            if stop_token_ids != "auto":
                raise ValueError(f"stop_token_ids must be 'auto', None or a list of ids; got '{stop_token_ids}'.")
            if self.preprocessor is None:
                return ()
            return (self.preprocessor.tokenizer.end_token_id,)
        if stop_token_ids is None:
            return ()
        return tuple(int(i) for i in stop_token_ids)

    def generate(self, inputs, max_length=None, max_new_tokens=None, stop_token_ids="auto"):
        """Greedy continuation of prompts, with a key/value cache.

        Args:
            inputs: a string or a list of strings (tokenized without an end
                token), or a dict of `token_ids` and `padding_mask`
                `(batch, length)` of right-padded prompts.
            max_length: total length (prompt and continuation) of every
                row. Give this or `max_new_tokens`, not both; with neither,
                the preprocessor's `sequence_length` (or the backbone's
                `max_sequence_length`).
            max_new_tokens: number of tokens to add to each prompt.
            stop_token_ids: a row stops after it emits one of these ids;
                `"auto"` is `<|endoftext|>`, `None` never stops early.

        Returns:
            Strings (prompt and continuation, decoded) for text input, a
            single string for a single string; otherwise a dict of numpy
            `token_ids` and `padding_mask` `(batch, length)`, right-padded.

        Prompts of different lengths share one buffer (KerasHub's in-place
        scheme): one pass over the right-padded prompts fills the cache, then
        step `t` writes the argmax at position `t` only in the rows whose
        prompt has no token there.
        """
        prompts, is_text, is_single = self._prompts(inputs)
        if not prompts:
            raise ValueError("generate needs at least one prompt; got an empty batch.")
        lengths = np.array([len(p) for p in prompts])
        for row, length in enumerate(lengths):
            if length == 0:
                raise ValueError(
                    f"Prompt {row} is empty: GPT-2 needs at least one prompt token to "
                    "condition on (it has no start token)."
                )
        limit = self.backbone.max_sequence_length
        if max_length is not None and max_new_tokens is not None:
            raise ValueError("Give max_length or max_new_tokens, not both.")
        if max_new_tokens is not None:
            if max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be non-negative; got {max_new_tokens}.")
            end_positions = lengths + int(max_new_tokens)
        else:
            if max_length is None:
                max_length = limit
                if self.preprocessor is not None:
                    max_length = min(limit, self.preprocessor.sequence_length)
            if max_length < lengths.max():
                raise ValueError(
                    f"max_length {max_length} is shorter than the longest prompt "
                    f"({int(lengths.max())} tokens)."
                )
            end_positions = np.full_like(lengths, int(max_length))
        buffer_length = int(end_positions.max())
        if buffer_length > limit:
            raise ValueError(
                f"Generating to length {buffer_length} exceeds the model's "
                f"max_sequence_length {limit}."
            )
        stop_ids = self._stop_token_ids(stop_token_ids)
        pad_id = stop_ids[0] if stop_ids else 0
        if self.preprocessor is not None:
            pad_id = self.preprocessor.tokenizer.end_token_id

        batch = len(prompts)
        token_ids = np.full((batch, buffer_length), pad_id, dtype="int32")
        prompt_mask = np.zeros((batch, buffer_length), dtype=bool)
        for row, ids in enumerate(prompts):
            token_ids[row, : len(ids)] = ids
            prompt_mask[row, : len(ids)] = True
        valid = prompt_mask.copy()
        token_ids = ops.convert_to_tensor(token_ids, "int32")
        prompt_mask_t = ops.convert_to_tensor(prompt_mask)
        end_positions_t = ops.convert_to_tensor(end_positions.astype("int32"))
        stop_t = ops.convert_to_tensor(np.array(stop_ids or [-1], dtype="int32"))

        cache = self.init_cache(batch, buffer_length)
        # One pass over the whole buffer fills the cache; positions past a
        # row's prompt are rewritten before any query can see them.
        _, _, cache = self.call_with_cache(token_ids, cache, 0)
        done = ops.zeros((batch,), dtype="bool")
        index = int(lengths.min())
        generated = []
        while index < buffer_length:
            logits, _, cache = self.call_with_cache(token_ids[:, index - 1 : index], cache, index - 1)
            next_token = ops.cast(ops.argmax(logits[:, 0, :], axis=-1), "int32")
            in_prompt = prompt_mask_t[:, index]
            writes = ops.logical_and(
                ops.logical_not(ops.logical_or(in_prompt, done)), ops.less(index, end_positions_t)
            )
            next_token = ops.where(in_prompt, token_ids[:, index], next_token)
            next_token = ops.where(ops.logical_or(in_prompt, writes), next_token, pad_id)
            token_ids = ops.slice_update(token_ids, [0, index], next_token[:, None])
            generated.append(writes)
            is_stop = ops.any(ops.equal(next_token[:, None], stop_t[None, :]), axis=-1)
            done = ops.logical_or(done, ops.logical_and(writes, is_stop))
            done = ops.logical_or(done, ops.greater_equal(index + 1, end_positions_t))
            index += 1
            if bool(ops.convert_to_numpy(ops.all(done))):
                break

        token_ids = np.asarray(ops.convert_to_numpy(token_ids))
        start = int(lengths.min())
        for offset, writes in enumerate(generated):
            valid[:, start + offset] |= np.asarray(ops.convert_to_numpy(writes))
        length = int(valid.any(axis=0).nonzero()[0].max()) + 1
        token_ids, valid = token_ids[:, :length], valid[:, :length]
        if not is_text:
            return {"token_ids": token_ids, "padding_mask": valid.astype("int32")}
        tokenizer = self.preprocessor.tokenizer
        texts = [tokenizer.decode(ids[mask]) for ids, mask in zip(token_ids, valid)]
        return texts[0] if is_single else texts
