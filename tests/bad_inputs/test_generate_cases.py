"""Bad arguments and inputs to `generate` and the errors they get: a table of
cases, each run by `test_bad_generate_input`, on a decoder-only model
(`GPTCausalLM`) and an encoder-decoder (`TransformerSeq2SeqLM`), which take
the same arguments. Every message names the argument; unknown names come
with close-name suggestions, mismatched arrays with both shapes."""

import functools

import numpy as np
import pytest

from attention_zoo_keras.generation import TopKSampler
from attention_zoo_keras.models.gpt import GPTBackbone
from attention_zoo_keras.models.gpt import GPTCausalLM
from attention_zoo_keras.models.transformer import TransformerBackbone
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM

VOCABULARY = 24
MAX_SEQUENCE_LENGTH = 16
START_ID = 0


@functools.cache
def _gpt():
    backbone = GPTBackbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dropout=0.0,
        attention_dropout=0.0, max_sequence_length=MAX_SEQUENCE_LENGTH,
    )
    return GPTCausalLM(backbone)


@functools.cache
def _seq2seq():
    backbone = TransformerBackbone(
        vocabulary_size=VOCABULARY, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=MAX_SEQUENCE_LENGTH, dropout=0.0, attention_dropout=0.0,
    )
    return TransformerSeq2SeqLM(backbone)


PROMPTS = {"token_ids": np.array([[3, 4, 5], [6, 7, 0]], "int32"), "padding_mask": np.array([[1, 1, 1], [1, 1, 0]])}
SOURCES = {
    "encoder_token_ids": np.array([[3, 4, 5], [6, 7, 0]], "int32"),
    "encoder_padding_mask": np.array([[1, 1, 1], [1, 1, 0]]),
}


def _lm(prompts=None, **arguments):
    return _gpt().generate(PROMPTS if prompts is None else prompts, **{"max_new_tokens": 2, **arguments})


def _mt(sources=None, **arguments):
    arguments = {"decoder_start_token_id": START_ID, "max_length": 4, **arguments}
    return _seq2seq().generate(SOURCES if sources is None else sources, **arguments)


def _prompts(**replace):
    return {**PROMPTS, **replace}


def _sources(**replace):
    return {**SOURCES, **replace}


# (id, callable, exception type, regex the message must match)
CASES = [
    # --- lengths --------------------------------------------------------------
    ("prompt_longer_than_the_default_max_length",
     lambda: _gpt().generate({"token_ids": np.ones((1, MAX_SEQUENCE_LENGTH + 1), "int32"),
                              "padding_mask": np.ones((1, MAX_SEQUENCE_LENGTH + 1), "int32")}), ValueError,
     rf"The default max_length, {MAX_SEQUENCE_LENGTH} \(the preprocessor's sequence_length or the model's limit\), "
     rf"is shorter than the longest prompt \({MAX_SEQUENCE_LENGTH + 1} tokens\)"),
    # --- unknown keyword arguments -------------------------------------------
    ("misspelled_max_length", lambda: _gpt().generate(PROMPTS, max_lenght=5), TypeError,
     r"GPTCausalLM\.generate\(\) got an unexpected keyword argument 'max_lenght'\. Did you mean: max_length"),
    ("misspelled_num_beams", lambda: _lm(num_beam=3), TypeError,
     r"unexpected keyword argument 'num_beam'\. Did you mean: num_beams"),
    ("misspelled_seq2seq_option", lambda: _mt(decoder_start_tokn_id=0), TypeError,
     r"TransformerSeq2SeqLM\.generate\(\) got an unexpected keyword argument 'decoder_start_tokn_id'\. "
     r"Did you mean: decoder_start_token_id"),
    ("seq2seq_option_on_a_causal_lm", lambda: _lm(force_end_token=False), TypeError,
     r"unexpected keyword argument 'force_end_token'"),
    # --- how the decoding arguments combine ----------------------------------
    ("num_beams_with_top_k", lambda: _mt(num_beams=4, sampler="top_k"), ValueError,
     r"num_beams=4 asks for beam search, but sampler='top_k' draws one token at a time.*sampler='beam'"),
    ("num_beams_with_temperature", lambda: _lm(num_beams=2, sampler="temperature"), ValueError,
     r"num_beams=2 asks for beam search, but sampler='temperature'"),
    ("num_beams_with_a_sampler_object", lambda: _lm(num_beams=3, sampler=TopKSampler(k=3)), ValueError,
     r"num_beams=3 asks for beam search, but sampler=TopKSampler"),
    ("length_penalty_without_beams", lambda: _lm(length_penalty=0.6), ValueError,
     r"length_penalty applies to beam search only.*num_beams > 1"),
    ("early_stopping_with_one_beam", lambda: _mt(num_beams=1, early_stopping=True), ValueError,
     r"early_stopping applies to beam search only"),
    ("sampler_option_with_beams", lambda: _mt(num_beams=3, temperature=0.5), ValueError,
     r"Beam search takes the options num_beams, length_penalty and early_stopping; got temperature"),
    ("zero_beams", lambda: _mt(num_beams=0), ValueError, r"num_beams must be a positive integer; got 0"),
    ("fractional_beams", lambda: _lm(sampler="beam", num_beams=2.5), ValueError,
     r"num_beams must be a positive integer; got 2\.5"),
    ("bad_early_stopping", lambda: _mt(num_beams=2, early_stopping="sometimes"), ValueError,
     r"early_stopping must be True, False or 'never'; got 'sometimes'"),
    ("unknown_sampler", lambda: _mt(sampler="top-k"), ValueError,
     r"Unknown sampler 'top-k'\. Did you mean: top_k"),
    # --- lengths -------------------------------------------------------------
    ("both_lengths", lambda: _mt(max_new_tokens=3), ValueError,
     r"Give max_length or max_new_tokens, not both \(got max_length=4, max_new_tokens=3\)"),
    ("float_max_length", lambda: _gpt().generate(PROMPTS, max_length=5.0), TypeError,
     r"max_length must be an int or None; got 5\.0"),
    ("negative_max_new_tokens", lambda: _lm(max_new_tokens=-1), ValueError,
     r"max_new_tokens must be non-negative; got -1"),
    ("seq2seq_no_new_tokens", lambda: _mt(max_length=None, max_new_tokens=0), ValueError,
     r"max_new_tokens must be at least 1 for a target token; got 0"),
    ("seq2seq_too_many_new_tokens", lambda: _mt(max_length=None, max_new_tokens=MAX_SEQUENCE_LENGTH), ValueError,
     r"max_new_tokens 16 \(after the decoder start token\) exceeds the model's max_sequence_length 16"),
    # --- other arguments -----------------------------------------------------
    ("seed_not_an_int", lambda: _lm(sampler="top_k", seed="7"), TypeError, r"seed must be an int or None; got '7'"),
    ("negative_seed", lambda: _mt(sampler="top_p", seed=-1), ValueError, r"seed must be non-negative; got -1"),
    ("stop_token_ids_a_single_id", lambda: _lm(stop_token_ids=5), TypeError,
     r"stop_token_ids must be a list of ids; got the single id 5 \(write \[5\]\)"),
    ("stop_token_ids_of_floats", lambda: _lm(stop_token_ids=[1.5]), TypeError,
     r"stop_token_ids must be a list of integer ids; got \[1\.5\]"),
    ("force_end_token_not_a_bool", lambda: _mt(force_end_token="yes"), TypeError,
     r"force_end_token must be True or False; got 'yes'"),
    # --- dict prompts (issue 19, item 8) -------------------------------------
    ("mask_of_another_batch_size", lambda: _lm(_prompts(padding_mask=PROMPTS["padding_mask"][:1])), ValueError,
     r"token_ids and padding_mask must both be \(batch, prompt_length\); got the shapes \(2, 3\) and \(1, 3\)"),
    ("mask_of_another_length", lambda: _lm(_prompts(padding_mask=np.ones((2, 4)))), ValueError,
     r"token_ids and padding_mask must both be \(batch, prompt_length\); got the shapes \(2, 3\) and \(2, 4\)"),
    ("mask_with_a_batch_axis_the_ids_lack", lambda: _lm({"token_ids": np.array([3, 4]), "padding_mask": [[1, 1]]}),
     ValueError, r"got the shapes \(2,\) and \(1, 2\)"),
    ("three_dimensional_ids", lambda: _lm({"token_ids": np.ones((1, 2, 3), "int32")}), ValueError,
     r"token_ids and padding_mask must both be \(batch, prompt_length\); got the shapes \(1, 2, 3\)"),
    ("seq2seq_mask_of_another_batch_size",
     lambda: _mt(_sources(encoder_padding_mask=np.ones((3, 3), "int32"))), ValueError,
     r"encoder_token_ids and encoder_padding_mask must both be \(batch, source_length\); "
     r"got the shapes \(2, 3\) and \(3, 3\)"),
    ("misspelled_dict_key", lambda: _lm({"token_ids": PROMPTS["token_ids"], "padding_masks": PROMPTS["padding_mask"]}),
     ValueError, r"generate's dict input takes 'token_ids' and 'padding_mask'; got the key 'padding_masks'\. "
                 r"Did you mean: padding_mask"),
    ("seq2seq_decoder_ids_in_the_dict", lambda: _mt(_sources(decoder_token_ids=np.zeros((2, 1), "int32"))),
     ValueError, r"takes 'encoder_token_ids' and 'encoder_padding_mask'; got the key 'decoder_token_ids'"),
    ("dict_without_ids", lambda: _lm({"padding_mask": PROMPTS["padding_mask"]}), ValueError,
     r"generate's dict input needs 'token_ids'; got the keys \['padding_mask'\]"),
    ("float_ids", lambda: _lm(_prompts(token_ids=PROMPTS["token_ids"] + 0.5)), TypeError,
     r"'token_ids' must hold integer token ids; got the dtype float64"),
    ("mask_values_beyond_one", lambda: _lm(_prompts(padding_mask=np.array([[1, 2, 1], [1, 1, 0]]))), ValueError,
     r"'padding_mask' must hold 1 for a token and 0 for padding; got the value 2"),
    ("left_padded_prompt", lambda: _lm(_prompts(padding_mask=np.array([[1, 1, 1], [0, 1, 1]]))), ValueError,
     r"Prompt 1's padding_mask is not right-padded"),
    ("empty_dict_batch", lambda: _lm({"token_ids": np.zeros((0, 3), "int32")}), ValueError,
     r"generate needs at least one prompt; got an empty batch"),
]


def test_the_table_is_well_formed():
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 12


@pytest.mark.parametrize(("run", "error", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_generate_input(run, error, message):
    with pytest.raises(error, match=message):
        run()
