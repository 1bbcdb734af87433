"""A streamer with `transformers`' protocol that records what it is given."""


class RecordingStreamer:
    """`put(ids)` with the ids of one row `(1, n)`, recorded as lists in
    `puts`; `end()` sets `ended`."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        assert value.ndim == 2 and value.shape[0] == 1
        self.puts.append(value[0].tolist())

    def end(self):
        self.ended = True
