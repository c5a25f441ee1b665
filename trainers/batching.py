"""Truncated-BPTT batching: parallel streams cut into windows, state carried across windows."""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor


def batchify(stream: Tensor, batch_size: int) -> Tensor:
    """Split a 1-D token stream into `batch_size` parallel streams: (steps, batch).

    The tail that does not fill a whole column is dropped.
    """
    steps = stream.numel() // batch_size
    if steps < 2:
        raise ValueError(
            f"batch_size: {batch_size} parallel streams leave fewer than 2 tokens each "
            f"in a split of {stream.numel()} tokens; use a smaller batch_size"
        )
    return stream[: steps * batch_size].view(batch_size, steps).t().contiguous()


def windows(batched: Tensor, bptt: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
    """(inputs, targets) windows of at most `bptt` steps, in order, from row `start`."""
    last = batched.shape[0] - 1
    for begin in range(start, last, bptt):
        end = min(begin + bptt, last)
        yield batched[begin:end], batched[begin + 1 : end + 1]
