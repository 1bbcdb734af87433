"""`generate`'s keyword arguments read and checked before anything is
compiled: its `**options` split between the sampler and the task, its
stop token ids, and counts."""

import numbers

import numpy as np

from attention_zoo_keras.generation.samplers import sampler_option_names
from attention_zoo_keras.naming import did_you_mean


def split_generate_options(options, task_option_names, argument_names, caller):
    """`(sampler options, task options)`: the entries of `generate`'s
    `**options` that a sampler takes, and those the task takes.

    Args:
        options: dict. `generate`'s `**options`.
        task_option_names: list of str. The task's own `generate` options.
        argument_names: list of str. `generate`'s named arguments, offered
            in the message for a name nobody takes.
        caller: str. What was called, for the message
            (`"GPTCausalLM.generate()"`).

    Raises:
        TypeError: for a name neither a sampler nor the task takes, with
            the closest known names and all of them.
    """
    sampler_names = sampler_option_names()
    for name in options:
        if name not in sampler_names and name not in task_option_names:
            known = [*argument_names, *sampler_names, *task_option_names]
            raise TypeError(
                f"{caller} got an unexpected keyword argument '{name}'."
                f"{did_you_mean(name, known)} It takes {', '.join(known)}."
            )
    return (
        {k: v for k, v in options.items() if k in sampler_names},
        {k: v for k, v in options.items() if k in task_option_names},
    )


def check_count(name, value):
    """`value` as an int, or `None`: a count `generate` takes (a length, a
    seed, a minimum).

    Raises:
        TypeError: for a value that is not an int (a bool included).
        ValueError: for a negative one.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None; got {value!r}.")
    if value < 0:
        raise ValueError(f"{name} must be non-negative; got {value}.")
    return int(value)


def parse_stop_token_ids(stop_token_ids, end_token_id):
    """A tuple of ids from `generate`'s `stop_token_ids`.

    Args:
        stop_token_ids: `"auto"`, None or a list of int. `"auto"` is
            `end_token_id`; `None` is no stop token.
        end_token_id: int or None. The tokenizer's end token (`None`
            without a tokenizer: `"auto"` then stops nowhere).

    Raises:
        ValueError: for a string other than `"auto"`.
        TypeError: for a single id, or ids that are not integers.
    """
    if isinstance(stop_token_ids, str):
        if stop_token_ids != "auto":
            raise ValueError(f"stop_token_ids must be 'auto', None or a list of ids; got '{stop_token_ids}'.")
        return () if end_token_id is None else (end_token_id,)
    if stop_token_ids is None:
        return ()
    if isinstance(stop_token_ids, numbers.Integral):
        raise TypeError(
            f"stop_token_ids must be a list of ids; got the single id {stop_token_ids} (write [{stop_token_ids}])."
        )
    ids = np.asarray(list(stop_token_ids))
    if ids.size and ids.dtype.kind not in "iu":
        raise TypeError(f"stop_token_ids must be a list of integer ids; got {list(stop_token_ids)!r}.")
    return tuple(int(i) for i in ids)
