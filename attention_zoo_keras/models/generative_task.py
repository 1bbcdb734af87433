"""What tasks that generate token sequences share: the stop tokens, the
right-padded buffer decoding writes into, the option checks of beam search,
and one compiled generation program per configuration."""

import numpy as np

from attention_zoo_keras.backend_support import compile_inference
from attention_zoo_keras.models.task import Task

# Generation buffers are rounded up to this multiple so that requests of
# similar lengths reuse one compiled program.
BUFFER_MULTIPLE = 64
BEAM_OPTIONS = {"num_beams", "length_penalty", "early_stopping"}


def round_up(value, multiple, cap):
    """`value` rounded up to a multiple of `multiple`, at most `cap` (and at
    least `value`)."""
    return max(value, min(-(-value // multiple) * multiple, cap))


def right_padded(prompts, length, pad_id):
    """`(token_ids, prompt_mask)` numpy arrays `(batch, length)` of the
    prompts (lists of ids), right-padded with `pad_id`."""
    token_ids = np.full((len(prompts), length), pad_id, dtype="int32")
    prompt_mask = np.zeros((len(prompts), length), dtype=bool)
    for row, ids in enumerate(prompts):
        token_ids[row, : len(ids)] = ids
        prompt_mask[row, : len(ids)] = True
    return token_ids, prompt_mask


def check_beam_sampler_options(sampler_options):
    """Raises for options `generate(sampler="beam")` does not take."""
    unknown = set(sampler_options) - BEAM_OPTIONS
    if unknown:
        raise ValueError(f"Beam search takes the options {sorted(BEAM_OPTIONS)}; got {sorted(unknown)}.")


class GenerativeTask(Task):
    """A `Task` with a `generate` method (see `GPTCausalLM`,
    `TransformerSeq2SeqLM`)."""

    def _stop_token_ids(self, stop_token_ids):
        """A tuple of ids from `"auto"` (the tokenizer's end token), `None`
        (no stop token) or a list."""
        if isinstance(stop_token_ids, str):
            if stop_token_ids != "auto":
                raise ValueError(f"stop_token_ids must be 'auto', None or a list of ids; got '{stop_token_ids}'.")
            if self.preprocessor is None:
                return ()
            return (self.preprocessor.tokenizer.end_token_id,)
        if stop_token_ids is None:
            return ()
        return tuple(int(i) for i in stop_token_ids)

    def _compiled(self, key, build):
        """The compiled generation function for `key`, built once by `build()`."""
        functions = self.__dict__.setdefault("_generation_functions", {})
        if key not in functions:
            functions[key] = compile_inference(build(), self.variables)
        return functions[key]
