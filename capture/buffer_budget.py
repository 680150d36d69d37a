"""The one memory budget for what the decoders hold, the same rule for the capture
(capture.flows' FlowTracker) and the proxy (capture.proxy's Proxy).

Owns `DEFAULT_MAX_BUFFER_BYTES` (--max-buffer-mb's default), the drop reason `BUFFER_BUDGET`,
and the two thresholds both enforce. Buffers are counted by their length, and a bytearray grown
by appends allocates up to 1/8 more, so the total is held to `budget_limit` (8/9 of the budget):
with the allocator's slack it stays within the budget. Past the limit the largest buffers are
dropped until the total is under `budget_target` (7/8 of the limit: the margin makes each walk
over the buffers free an eighth of the budget), each a counted drop and a Desync of kind
"buffer_budget".

Imports nothing. Pure Python and not compiled: the hot path reads it when a tracker is built
and when the budget is enforced, never per packet.
"""

from __future__ import annotations

# Decoder buffers (and the capture's held out-of-order segments) of all connections together. A
# flow may hold ~1 MiB per direction (max_decoded_frame) plus its held segments, so 250 flows with
# partial frames filled a 512 MiB pod.
DEFAULT_MAX_BUFFER_BYTES = 128 << 20
BUFFER_BUDGET = "buffer_budget"  # a buffer dropped because all of them together passed the budget


def budget_limit(max_buffer_bytes: int) -> int:
    """The total the buffers' lengths are held to: 8/9 of the budget (module docstring)."""
    return max_buffer_bytes * 8 // 9


def budget_target(limit: int) -> int:
    """Past `limit`, drop buffers until the total is under this: 7/8 of it."""
    return limit - (limit >> 3)
