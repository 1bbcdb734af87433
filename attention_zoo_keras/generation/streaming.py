"""Streaming `generate`'s output while the compiled loop runs.

The loop is run in chunks (`in_place_decoding.decode_until`: one compiled
program, called with a growing end position), and after each chunk the
tokens written so far are handed out: as token ids to a `streamer` (the
protocol of `transformers`' streamers: `put(ids)` with the prompt first,
then the new tokens, and `end()`), or as text pieces (`generate(...,
stream=True)`).

Chunks grow from one token (a short time to the first token) to
`MAX_CHUNK` tokens (few program calls and host reads per token).

Text is cut from the decoding of all of a row's tokens, never of a chunk
alone: byte-level BPE tokens may hold part of a character, and SentencePiece
pieces carry the space before them, so a chunk's own decoding is not its
share of the text. A piece is handed out once the text decoded so far
extends the text already handed out; an unfinished character at the end
(which decodes to one U+FFFD, the replacement character) waits for the
next chunk, which may finish it.
"""

import numpy as np

# The largest number of tokens decoded between two hand-outs.
MAX_CHUNK = 16
REPLACEMENT_CHARACTER = "\ufffd"


def chunk_ends(start, end):
    """Where successive chunks of a loop that starts at position `start` and
    ends before `end` stop: `start + 1, start + 3, start + 7, ...`, each
    chunk twice the last, at most `MAX_CHUNK` tokens, the last at `end`.

    >>> list(chunk_ends(4, 40))
    [5, 7, 11, 19, 35, 40]
    """
    position, size = start, 1
    while position < end:
        position = min(position + size, end)
        size = min(2 * size, MAX_CHUNK)
        yield position


class IncrementalText:
    """The text of one growing row of token ids, handed out in pieces whose
    concatenation is the text of the whole row.

    Args:
        decode: callable. `decode(ids) -> str`, the tokenizer's decoding
            of a row as `generate` writes its output.
    """

    def __init__(self, decode):
        self.decode = decode
        self.handed_out = ""

    def piece(self, ids, final=False):
        """The text of `ids` (the whole row so far) not handed out yet, less
        a last replacement character (unless `final`); `""` where it would
        not extend what was handed out.

        Raises:
            RuntimeError: with `final`, when the row's text does not start
                with what was handed out (a tokenizer whose decoding of a
                row changes text it already gave).
        """
        text = self.decode(ids)
        if not final and text.endswith(REPLACEMENT_CHARACTER):
            text = text[:-1]  # the start of a character its next bytes may finish
        if not text.startswith(self.handed_out):
            if final:
                raise RuntimeError(
                    f"The streamed text {self.handed_out!r} is not the start of the row's text {text!r}."
                )
            return ""
        piece, self.handed_out = text[len(self.handed_out):], text
        return piece


def text_pieces(buffers, decode, is_single):
    """The text pieces of successive `(token_ids, valid)` buffers (numpy,
    `(batch, length)`, each holding more of every row than the last).

    Args:
        buffers: iterable of tuples. The buffers, the last one final.
        decode: callable. `decode(ids) -> str` for one row.
        is_single: bool. Yield strings (one row) rather than lists of
            strings (a piece per row, `""` where a row has nothing new).

    Yields:
        str or list of str: only where some row has new text.
    """
    texts, last = None, None
    for token_ids, valid in buffers:
        if texts is None:
            texts = [IncrementalText(decode) for _ in range(len(token_ids))]
        last = (token_ids, valid)
        pieces = [text.piece(ids[mask]) for text, ids, mask in zip(texts, token_ids, valid)]
        if any(pieces):
            yield pieces[0] if is_single else pieces
    if last is not None:
        token_ids, valid = last
        pieces = [text.piece(ids[mask], final=True) for text, ids, mask in zip(texts, token_ids, valid)]
        if any(pieces):
            yield pieces[0] if is_single else pieces


def check_streamer(streamer):
    """Raises unless `streamer` has `put` and `end` (`transformers`'
    streamer protocol)."""
    if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
        raise TypeError(
            f"streamer must have put(token_ids) and end() methods, as transformers' streamers do; got "
            f"{type(streamer).__name__}."
        )


def feed_streamer(streamer, buffers):
    """Hands the tokens of successive `(token_ids, valid)` buffers of one
    row to `streamer`: the first buffer's (the prompt) in one `put`, then
    each buffer's new ones, as int arrays of shape `(1, n)`; then `end()`.

    Returns:
        tuple: the last buffer.
    """
    handed_out, last = 0, None
    for token_ids, valid in buffers:
        ids = token_ids[0][valid[0]]
        if len(ids) > handed_out:
            streamer.put(np.asarray(ids[handed_out:])[None, :])
            handed_out = len(ids)
        last = (token_ids, valid)
    streamer.end()
    return last
