"""A recorded step replayed as one captured CUDA graph (torch on CUDA).

A recording (`recorded_steps`) still launches every kernel from the host:
for a one-token decoding step of GPT-2 small that is about 400 launches,
which take longer than the GPU takes to run them at small batches. A CUDA
graph (`torch.cuda.CUDAGraph`) records the launches once and replays them
all with one call, so the host's cost per step no longer depends on the
number of operations.

A graph reads and writes fixed addresses, so `GraphReplay` owns a buffer per
input: the model's weights are used where they are (their tensors are
assigned in place, so their addresses never change), every other input is
copied into a buffer the graph owns, at capture and at each call whose
argument lives elsewhere. An input the step writes in place (a key/value
cache row, the token buffer) is returned as that buffer itself, so a loop
that feeds the results back pays no copy; every other output is cloned, so
it stays valid after the next call.
"""

import logging

logger = logging.getLogger("attention_zoo_keras")

# Calls before capture: TorchScript profiles a traced function on its first
# calls and compiles its optimised form after them; cuBLAS and the caching
# allocator initialise lazily. None of that may happen during a capture.
_WARM_UP_CALLS = 3


class GraphReplay:
    """`program(inputs) -> outputs` (flat lists of tensors on one CUDA
    device) replayed from a CUDA graph captured on the first `inputs`.

    The first `num_persistent` inputs are taken as they are (the weights);
    the rest are cloned into the graph's own buffers. `program` must be
    shape-static and must not synchronise with the host; it runs
    `_WARM_UP_CALLS` times before the capture, so its in-place writes must
    give the same result when repeated (a cache row written from the
    inputs).
    """

    def __init__(self, program, num_persistent, inputs):
        import torch

        self.buffers = [x if index < num_persistent else x.clone() for index, x in enumerate(inputs)]
        side_stream = torch.cuda.Stream()
        side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side_stream):
            for _ in range(_WARM_UP_CALLS):
                program(self.buffers)
        torch.cuda.current_stream().wait_stream(side_stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = list(program(self.buffers))
        self.aliases = [self._buffer_index(output) for output in self.outputs]

    def _buffer_index(self, output):
        """The index of the input buffer `output` is (an input written in
        place and returned), or `None`."""
        for index, buffer in enumerate(self.buffers):
            if (
                output.data_ptr() == buffer.data_ptr()
                and output.shape == buffer.shape
                and output.stride() == buffer.stride()
                and output.dtype == buffer.dtype
            ):
                return index
        return None

    def __call__(self, inputs):
        for buffer, x in zip(self.buffers, inputs):
            if x.data_ptr() != buffer.data_ptr():
                buffer.copy_(x)
        self.graph.replay()
        return [
            output.clone() if alias is None else self.buffers[alias]
            for output, alias in zip(self.outputs, self.aliases)
        ]


def captured_or_plain(program, num_persistent, inputs):
    """`GraphReplay(program, num_persistent, inputs)`, or `program` itself
    (with a warning naming the reason) if the capture fails."""
    try:
        return GraphReplay(program, num_persistent, inputs)
    except Exception as error:  # a step the graph cannot hold (a host sync): replayed kernel by kernel
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        logger.warning("The step could not be captured as a CUDA graph, so it replays kernel by kernel: %s", reason)
        return program
