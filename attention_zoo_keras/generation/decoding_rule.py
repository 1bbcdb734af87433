"""How `generate`'s decoding arguments combine, with the meanings a
`transformers` user expects: `num_beams > 1` without a sampler is beam
search, one beam without a sampler is greedy decoding, and an argument that
the chosen decoding would not use is an error, never ignored."""

from attention_zoo_keras.generation.beam_search import check_beam_options
from attention_zoo_keras.generation.samplers import Sampler
from attention_zoo_keras.generation.samplers import get_sampler

# Beams `sampler="beam"` searches with when `num_beams` is not given.
DEFAULT_NUM_BEAMS = 4


def _sampler_name(sampler):
    return type(sampler).__name__ if isinstance(sampler, Sampler) else repr(sampler)


def decoding_rule(sampler=None, num_beams=None, length_penalty=None, early_stopping=None, **sampler_options):
    """The decoding `generate` runs: a `Sampler` or `BeamOptions`.

    Args:
        sampler: str, Sampler or None. `None` (greedy, or beam search when
            `num_beams > 1`), a name from `sampler_names()` or a `Sampler`.
        num_beams: int or None. A positive int; above 1, beam search.
        length_penalty: float or None. Beam search's length penalty; `None`
            when not given.
        early_stopping: bool, `"never"` or None. Beam search's stopping
            rule; `None` when not given.
        **sampler_options: dict. The sampler's options (`temperature`, `k`,
            `p`).

    Raises:
        ValueError: for a sampler with `num_beams > 1`, beam options without
            beam search, sampler options with beam search, and any invalid
            value (see `get_sampler`, `check_beam_options`).
    """
    is_beam_name = isinstance(sampler, str) and sampler == "beam"
    if num_beams is not None:
        check_beam_options(num_beams, 1.0, False)
    if sampler is not None and not is_beam_name and num_beams is not None and num_beams > 1:
        raise ValueError(
            f"num_beams={num_beams} asks for beam search, but sampler={_sampler_name(sampler)} draws one token at "
            "a time; the two cannot be combined. Leave sampler unset (or pass sampler='beam') for beam search, "
            "or leave num_beams unset (or 1) to use the sampler."
        )
    if is_beam_name or (sampler is None and num_beams is not None and num_beams > 1):
        if sampler_options:
            raise ValueError(
                "Beam search takes the options num_beams, length_penalty and early_stopping; got "
                f"{', '.join(sorted(sampler_options))}, which only the samplers take (sampler='temperature', "
                "'top_k' or 'top_p', with num_beams unset)."
            )
        return check_beam_options(
            DEFAULT_NUM_BEAMS if num_beams is None else num_beams,
            1.0 if length_penalty is None else length_penalty,
            False if early_stopping is None else early_stopping,
        )
    for name, value in (("length_penalty", length_penalty), ("early_stopping", early_stopping)):
        if value is not None:
            raise ValueError(
                f"{name} applies to beam search only, and this call decodes with one beam "
                f"(sampler={_sampler_name(sampler)}, num_beams={num_beams}). Pass num_beams > 1 for beam search, "
                f"or leave {name} out."
            )
    return get_sampler("greedy" if sampler is None else sampler, **sampler_options)
