"""`generate`'s keyword arguments: `**options` split between the sampler
and the task, and the stop token ids, with an error that names what is
wrong."""

import numpy as np
import pytest

from attention_zoo_keras.generation.generate_arguments import parse_stop_token_ids
from attention_zoo_keras.generation.generate_arguments import split_generate_options


def test_options_go_to_the_sampler_or_the_task():
    options = {"temperature": 0.5, "p": 0.9, "decoder_start_token_id": 3}
    sampler_options, task_options = split_generate_options(
        options, ["decoder_start_token_id"], ["seed"], "LM.generate()"
    )
    assert sampler_options == {"temperature": 0.5, "p": 0.9}
    assert task_options == {"decoder_start_token_id": 3}


def test_an_unknown_option_names_the_closest_and_every_known_one():
    with pytest.raises(TypeError, match=r"LM\.generate\(\) got an unexpected keyword argument 'sede'\. "
                                        r"Did you mean: seed\? It takes seed, .*temperature, force_end"):
        split_generate_options({"sede": 1}, ["force_end"], ["seed"], "LM.generate()")


def test_stop_token_ids():
    assert parse_stop_token_ids("auto", 7) == (7,)
    assert parse_stop_token_ids("auto", None) == ()
    assert parse_stop_token_ids(None, 7) == ()
    assert parse_stop_token_ids(np.array([3, 4]), 7) == (3, 4)
    assert parse_stop_token_ids([], 7) == ()
    with pytest.raises(ValueError, match="must be 'auto', None or a list of ids; got 'eos'"):
        parse_stop_token_ids("eos", 7)
    with pytest.raises(TypeError, match=r"got the single id 5 \(write \[5\]\)"):
        parse_stop_token_ids(5, 7)
    with pytest.raises(TypeError, match=r"a list of integer ids; got \[1\.5\]"):
        parse_stop_token_ids([1.5], 7)
