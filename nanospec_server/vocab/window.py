"""Per-request candidate windows, kept on the device and updated with batched tensor ops.

A request's candidate stream S is only ever read through its last W_max positions, so each
slot stores:

- ``ring[slot, p % W_cap]``: the token at stream position p, for the last W_cap positions;
- ``length[slot]``: |S|;
- ``last_pos[slot, v]``: the latest stream position of token v (-1: never seen);
- ``members[slot, j]``: the tokens of the active set as of the last refresh, in a fixed
  table of W_cap entries (-1: free). The active set never has more than W_max <= W_cap
  tokens, so the table never overflows;
- ``in_set[slot, v]``: the same set as a dense bitmap, for O(1) membership;
- ``scanned[slot]``, ``member_pos[slot, j]``: bookkeeping of the CPU fast path only: the
  window [start, end) at the last refresh (only positions new to the window are scanned)
  and a known position of each member (only members near the window's edge are looked up).

Token v is active iff ``last_pos[v] >= length - W_max``: it leaves the window only when its
*latest* occurrence does. Memory per slot is O(V + W_cap), independent of |S|.

W_max is per slot: the methods below take one int for every slot of the call or a [B]
device tensor, one W_max per row of ``slots`` (each <= W_cap, which the ring holds).

Every array has one spare "dump" column (index V or W_cap). Masked entries of a batched
write are sent there, so writes need no data-dependent shapes (no host sync, graph-safe).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from nanospec_server import ops

# One window length for every slot of a call, or a [B] int64 tensor: one per row of slots.
WMax = int | Tensor


@dataclass
class WindowDiff:
    """What changed in the active sets of a batch of slots at one refresh.

    Row b describes slot ``slots[b]``; ``enter``/``leave`` mask the token columns.
    """

    slots: Tensor  # [B] int64
    enter_tokens: Tensor  # [B, W_cap] int64, global ids (any valid id where masked)
    enter: Tensor  # [B, W_cap] bool
    leave_tokens: Tensor  # [B, W_cap] int64
    leave: Tensor  # [B, W_cap] bool
    # The same changes compacted (fused refresh only): enter_list, leave_list [B, W_cap]
    # with each row's tokens first, in mask order, and their lengths [B, 2] (enter, leave).
    compact: tuple[Tensor, Tensor, Tensor] | None = None


class WindowState:
    def __init__(self, vocab_size: int, w_cap: int, num_slots: int, device: torch.device):
        self.vocab_size, self.w_cap, self.num_slots = vocab_size, w_cap, num_slots
        self.device = device
        v, w = vocab_size, w_cap
        self.ring = torch.zeros(num_slots, w + 1, dtype=torch.int64, device=device)
        self.length = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.last_pos = torch.full((num_slots, v + 1), -1, dtype=torch.int32, device=device)
        self.members = torch.full((num_slots, w + 1), -1, dtype=torch.int64, device=device)
        self.in_set = torch.zeros(num_slots, v + 1, dtype=torch.bool, device=device)
        self.scanned = torch.zeros(num_slots, 2, dtype=torch.int64, device=device)
        self.member_pos = torch.full((num_slots, w + 1), -1, dtype=torch.int32, device=device)
        self.columns = torch.arange(w, device=device)

    @staticmethod
    def bytes_per_slot(vocab_size: int, w_cap: int) -> int:
        v, w = vocab_size + 1, w_cap + 1
        # ring, length, last_pos, members, in_set, scanned, member_pos
        return 8 * w + 8 + 4 * v + 8 * w + v + 16 + 4 * w

    def nbytes(self) -> int:
        tensors = (self.ring, self.length, self.last_pos, self.members, self.in_set)
        tensors += (self.scanned, self.member_pos)
        return sum(t.numel() * t.element_size() for t in tensors)

    def reset(self, slots: Tensor) -> None:
        """Forget the streams of these slots (apply ``release`` to the head before this)."""
        self.length[slots] = 0
        self.last_pos[slots] = -1
        self.members[slots] = -1
        self.in_set[slots] = False
        self.scanned[slots] = 0

    def release(self, slots: Tensor) -> WindowDiff:
        """The diff that removes every member of these slots (used before a reset)."""
        members = self.members[slots, : self.w_cap]
        leave = members >= 0
        none = torch.zeros_like(leave)
        return WindowDiff(slots, members.clamp(min=0), none, members.clamp(min=0), leave)

    def append(self, slots: Tensor, tokens: Tensor, valid: Tensor | None = None) -> None:
        """Append each row's valid tokens, in column order, to its slot's stream."""
        tokens = tokens.to(torch.int64)
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        offset = valid.cumsum(1) - 1  # rank of each valid token within its row
        count = valid.sum(1, keepdim=True)
        positions = self.length[slots].unsqueeze(1) + offset
        # Only a row's last W_cap tokens can reach the ring; dropping the rest avoids two
        # writes to one ring cell (whose winner would be unspecified).
        in_ring = valid & (offset >= count - self.w_cap)
        ops.window_append(self.ring, self.last_pos, slots, tokens, positions, valid, in_ring)
        self.length[slots] += count.squeeze(1)

    def window_start(self, slots: Tensor, w_max: WMax) -> Tensor:
        return (self.length[slots] - w_max).clamp(min=0)

    def window_tokens(self, slots: Tensor, w_max: WMax) -> tuple[Tensor, Tensor]:
        """The distinct tokens of each slot's window: ([B, W_cap] tokens, [B, W_cap] mask).

        Ring column c holds the latest position p < length with p % W_cap == c; a token is
        counted at its latest position only, which makes the mask duplicate-free.
        """
        length = self.length[slots].unsqueeze(1)
        positions = length - 1 - (length - 1 - self.columns) % self.w_cap
        in_window = positions >= self.window_start(slots, w_max).unsqueeze(1)
        tokens = self.ring[slots, : self.w_cap]
        latest = self.last_pos[slots.unsqueeze(1), tokens] == positions
        return tokens, in_window & latest

    def contains(self, slots: Tensor, tokens: Tensor, w_max: WMax) -> Tensor:
        start = self.window_start(slots, w_max).unsqueeze(1)
        return self.last_pos[slots.unsqueeze(1), tokens.to(torch.int64)] >= start

    def refresh(self, slots: Tensor, w_max: WMax) -> WindowDiff:
        """Bring ``members``/``in_set`` of these slots to their current windows.

        On CUDA one Triton kernel does it (``ops.window_refresh``), also emitting the
        compact diff the union kernel reads; the torch code below is its reference, and
        the path elsewhere."""
        state = (self.ring, self.length, self.last_pos, self.members, self.in_set)
        if (fused := ops.window_refresh(*state, slots, w_max)) is not None:
            return WindowDiff(slots, *fused)
        return self.refresh_reference(slots, w_max)

    def refresh_reference(self, slots: Tensor, w_max: WMax) -> WindowDiff:
        rows = slots.unsqueeze(1)
        dump = self.w_cap
        # Leave: members whose latest occurrence fell out of the window.
        members = self.members[slots, : self.w_cap]
        start = self.window_start(slots, w_max).unsqueeze(1)
        leave_tokens = members.clamp(min=0)
        leave = (members >= 0) & (self.last_pos[rows, leave_tokens] < start)
        self.in_set[rows, torch.where(leave, leave_tokens, self.vocab_size)] = False
        members = members.masked_fill(leave, -1)
        # Enter: distinct window tokens not yet members; they take the free table entries
        # in order (the k-th entering token gets the k-th free entry).
        tokens, in_window = self.window_tokens(slots, w_max)
        enter = in_window & ~self.in_set[rows, tokens]
        free = members < 0
        free_list = torch.full_like(self.members[slots], dump)
        free_rank = torch.where(free, free.cumsum(1) - 1, dump)
        free_list.scatter_(1, free_rank, self.columns.expand_as(free_rank))
        enter_rank = (enter.cumsum(1) - 1).clamp(min=0)
        destination = torch.where(enter, free_list.gather(1, enter_rank), dump)
        members = torch.cat([members, members.new_full((len(slots), 1), -1)], 1)
        members.scatter_(1, destination, tokens)
        members[:, dump] = -1
        self.members[slots] = members
        self.in_set[rows, torch.where(enter, tokens, self.vocab_size)] = True
        self.in_set[:, self.vocab_size] = False
        return WindowDiff(slots, tokens, enter, leave_tokens, leave)
