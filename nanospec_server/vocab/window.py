"""Per-request candidate windows, kept on the device and updated with batched tensor ops.

A request's candidate stream S is only ever read through its last W_max positions, so each
slot stores O(W_cap) values plus one V-bit bitmap:

- ``ring[slot, p % W_cap]``: the token at stream position p, for the last W_cap positions;
- ``latest[slot, c]``: ring cell c holds the *latest* occurrence of its token in the ring
  (no later position holds the same token). Appends keep it exact: an appended token
  clears the flag of the cell holding its previous occurrence, and among the tokens of
  one append only the last occurrence of each is flagged;
- ``length[slot]``: |S|;
- ``members[slot, j]``: the tokens of the active set as of the last refresh, in a fixed
  table of W_cap entries (-1: free). The active set never has more than W_max <= W_cap
  tokens, so the table never overflows;
- ``in_set[slot]``: the same set as a packed bitmap (``ops.bitmap``: V bits in int32
  words), for O(1) membership in the packed head's per-(row, token) mask.

Token v is active iff a flagged cell at a position >= length - W_max holds it: it leaves
the window only when its *latest* occurrence does (the window lies inside the ring, so
its latest occurrence there is its latest in S). Memory per slot is O(W_cap) + V/8 bytes,
independent of |S|.

A refresh finds the changes without any per-token position: clear the bits of the
window's tokens that were members, so the bits still set are the members that left; then
set the bits of every window token (those found clear in the first pass entered).

W_max is per slot: the methods below take one int for every slot of the call or a [B]
device tensor, one W_max per row of ``slots`` (each <= W_cap, which the ring holds).

``ring``, ``latest`` and ``members`` have one spare "dump" column (index W_cap). Masked
entries of a batched write are sent there, so writes need no data-dependent shapes (no
host sync, graph-safe).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from nanospec_server import ops
from nanospec_server.ops import bitmap

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
        w = w_cap
        self.ring = torch.zeros(num_slots, w + 1, dtype=torch.int32, device=device)
        self.latest = torch.zeros(num_slots, w + 1, dtype=torch.bool, device=device)
        self.length = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.members = torch.full((num_slots, w + 1), -1, dtype=torch.int32, device=device)
        self.in_set = bitmap.empty(num_slots, vocab_size, device)
        self.columns = torch.arange(w, device=device)

    @staticmethod
    def bytes_per_slot(vocab_size: int, w_cap: int) -> int:
        w = w_cap + 1
        # ring, latest, length, members, in_set
        return 4 * w + w + 8 + 4 * w + 4 * bitmap.words_for(vocab_size)

    def nbytes(self) -> int:
        tensors = (self.ring, self.latest, self.length, self.members, self.in_set)
        return sum(t.numel() * t.element_size() for t in tensors)

    def reset(self, slots: Tensor) -> None:
        """Forget the streams of these slots (apply ``release`` to the head before this).
        Ring cells keep stale tokens; with ``length`` 0 no window reaches them."""
        self.length[slots] = 0
        self.latest[slots] = False
        self.members[slots] = -1
        self.in_set[slots] = 0

    def release(self, slots: Tensor) -> WindowDiff:
        """The diff that removes every member of these slots (used before a reset)."""
        members = self.members[slots, : self.w_cap].to(torch.int64)
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
        # writes to one ring cell (whose winner would be unspecified). When any is dropped
        # every older cell is overwritten, so the dropped ones supersede nothing either.
        in_ring = valid & (offset >= count - self.w_cap)
        ops.window_append(self.ring, self.latest, slots, tokens, positions, in_ring)
        self.length[slots] += count.squeeze(1)

    def window_start(self, slots: Tensor, w_max: WMax) -> Tensor:
        return (self.length[slots] - w_max).clamp(min=0)

    def window_tokens(self, slots: Tensor, w_max: WMax) -> tuple[Tensor, Tensor]:
        """The distinct tokens of each slot's window: ([B, W_cap] int64 tokens, [B, W_cap]
        mask).

        Ring column c holds the latest position p < length with p % W_cap == c; a token is
        counted at its latest occurrence only (the flagged cell), which makes the mask
        duplicate-free. Columns no position has reached yet have p < 0: never in a window.
        """
        length = self.length[slots].unsqueeze(1)
        positions = length - 1 - (length - 1 - self.columns) % self.w_cap
        in_window = positions >= self.window_start(slots, w_max).unsqueeze(1)
        tokens = self.ring[slots, : self.w_cap].to(torch.int64)
        return tokens, in_window & self.latest[slots, : self.w_cap]

    def contains(self, slots: Tensor, tokens: Tensor, w_max: WMax) -> Tensor:
        """Membership of ``tokens[b, :]`` in the window of ``slots[b]``: a binary search in
        the sorted window (fixed shapes, O((T + W_cap) log W_cap) per row)."""
        window, in_window = self.window_tokens(slots, w_max)
        keys = torch.where(in_window, window, -1).sort(1).values  # -1: matches no token
        tokens = tokens.to(torch.int64).contiguous()
        at = torch.searchsorted(keys, tokens).clamp(max=self.w_cap - 1)
        return keys.gather(1, at) == tokens

    def refresh(self, slots: Tensor, w_max: WMax) -> WindowDiff:
        """Bring ``members``/``in_set`` of these slots to their current windows.

        On CUDA one Triton kernel does it (``ops.window_refresh``), also emitting the
        compact diff the union kernel reads; the torch code below is its reference, and
        the path elsewhere."""
        state = (self.ring, self.latest, self.length, self.members, self.in_set)
        if (fused := ops.window_refresh(*state, slots, w_max)) is not None:
            return WindowDiff(slots, *fused)
        return self.refresh_reference(slots, w_max)

    def refresh_reference(self, slots: Tensor, w_max: WMax) -> WindowDiff:
        rows = slots.unsqueeze(1)
        dump = self.w_cap
        tokens, in_window = self.window_tokens(slots, w_max)
        # Window tokens already members stay: clear their bits for now, so that the bits
        # still set are exactly the members that left. The others enter.
        stays = in_window & bitmap.test(self.in_set, rows, tokens)
        enter = in_window & ~stays
        bitmap.flip(self.in_set, slots, tokens, stays)
        members = self.members[slots, : self.w_cap].to(torch.int64)
        leave_tokens = members.clamp(min=0)
        leave = (members >= 0) & bitmap.test(self.in_set, rows, leave_tokens)
        bitmap.flip(self.in_set, slots, leave_tokens, leave)  # the rows are all clear now
        bitmap.flip(self.in_set, slots, tokens, in_window)  # the new active sets
        members = members.masked_fill(leave, -1)
        # Entering tokens take the free table entries in order (the k-th entering token
        # gets the k-th free entry).
        free = members < 0
        free_list = torch.full((len(slots), self.w_cap + 1), dump, device=self.device)
        free_rank = torch.where(free, free.cumsum(1) - 1, dump)
        free_list.scatter_(1, free_rank, self.columns.expand_as(free_rank))
        enter_rank = (enter.cumsum(1) - 1).clamp(min=0)
        destination = torch.where(enter, free_list.gather(1, enter_rank), dump)
        members = torch.cat([members, members.new_full((len(slots), 1), -1)], 1)
        members.scatter_(1, destination, tokens)
        members[:, dump] = -1
        self.members[slots] = members.to(torch.int32)
        return WindowDiff(slots, tokens, enter, leave_tokens, leave)
