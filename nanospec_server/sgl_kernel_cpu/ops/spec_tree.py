"""EAGLE draft-tree ops: tree construction, greedy verification, accept bookkeeping.

Plain-PyTorch stand-ins for sgl_kernel's ``build_tree_kernel_efficient_cpu``,
``verify_tree_greedy_cpu``, ``fill_bonus_tokens_cpu`` and ``fill_accept_out_cache_loc_cpu``.
The per-request work is tiny (a handful of draft tokens), so it is done on Python lists
and written back to the output tensors once.

Tree encoding (per request, ``n = num_verify_tokens`` nodes, node 0 = the bonus/root token):

* ``selected_index[i - 1]`` is node ``i``'s index into the flat draft-candidate list;
  ``selected_index // topk`` indexes ``parent_list``. A result of 0 means "child of the
  root"; otherwise ``parent_list[...]`` is the parent's candidate index, and the parent is
  the node whose ``selected_index`` equals it.
* ``retrieve_next_token[p]`` is p's first child, ``retrieve_next_sibling[c]`` the next child
  of the same parent (children in ascending node order); -1 ends a list.
* ``retrieve_index[i] = b * n + i`` is the node's row in the flattened batch.
"""

from __future__ import annotations

import torch

__all__ = [
    "TREE_MASK_FULL",
    "TREE_MASK_QLEN_ONLY",
    "TREE_MASK_QLEN_ONLY_BITPACKING",
    "build_tree_kernel_efficient",
    "verify_tree_greedy",
    "fill_bonus_tokens",
    "fill_accept_out_cache_loc",
]

# Values of SGLang's TreeMaskMode enum.
TREE_MASK_FULL = 0
TREE_MASK_QLEN_ONLY = 1
TREE_MASK_QLEN_ONLY_BITPACKING = 2


def _parents(selected: list[int], parent_row: list[int], topk: int, n: int) -> list[int]:
    """Parent node of every node (``-1`` for the root or an orphan whose parent is absent)."""
    node_of_candidate = {}
    for pos, cand in enumerate(selected[: n - 1]):
        # First occurrence wins, matching a front-to-back search.
        node_of_candidate.setdefault(cand, pos + 1)
    parents = [-1] * n
    for node in range(1, n):
        parent_slot = selected[node - 1] // topk
        if parent_slot == 0:
            parents[node] = 0
        else:
            parents[node] = node_of_candidate.get(parent_row[parent_slot], -1)
    return parents


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Fill the tree mask, positions and retrieve links for each request's draft tree.

    The caller pre-fills the retrieve tensors with -1 and the mask with True (bool modes)
    or 0 (bit-packed); only tree cells are written here, so FULL_MASK's prefix columns keep
    the caller's fill. Mask row ``x`` marks node ``x`` and its ancestors (root included).
    """
    n = draft_token_num
    bs = verified_seq_len.shape[0]
    seq_lens = verified_seq_len.tolist()
    selected_rows = selected_index.tolist()
    parent_rows = parent_list.reshape(bs, -1).tolist() if parent_list.numel() else [[]] * bs
    mode = int(tree_mask_mode)

    pos_out: list[int] = []
    rindex: list[list[int]] = []
    rnext: list[list[int]] = []
    rsib: list[list[int]] = []
    masks: list[list[list[bool]]] = []
    for b in range(bs):
        parents = _parents(selected_rows[b], parent_rows[b], topk, n)
        next_token = [-1] * n
        next_sibling = [-1] * n
        # Descending walk, each new child pushed to the front -> ascending child order.
        for node in range(n - 1, 0, -1):
            p = parents[node]
            if p >= 0:
                next_sibling[node] = next_token[p]
                next_token[p] = node
        rindex.append([b * n + i for i in range(n)])
        rnext.append(next_token)
        rsib.append(next_sibling)

        rows = []
        for x in range(n):
            row = [False] * n
            row[0] = True
            node, steps = x, 0
            # Walk up at most `depth` edges (a well-formed tree is never deeper).
            while node > 0 and steps < depth:
                row[node] = True
                steps += 1
                node = parents[node]
            rows.append(row)
            pos_out.append(int(seq_lens[b]) + steps)
        masks.append(rows)

    positions[: bs * n] = torch.tensor(pos_out, dtype=positions.dtype)
    retrieve_index.view(bs, n)[:] = torch.tensor(rindex, dtype=retrieve_index.dtype)
    retrieve_next_token.view(bs, n)[:] = torch.tensor(rnext, dtype=retrieve_next_token.dtype)
    retrieve_next_sibling.view(bs, n)[:] = torch.tensor(rsib, dtype=retrieve_next_sibling.dtype)
    _write_tree_mask(tree_mask, masks, seq_lens, mode)


def _write_tree_mask(
    tree_mask: torch.Tensor, masks: list[list[list[bool]]], seq_lens: list[int], mode: int
) -> None:
    if not masks:
        return
    bs, n = len(masks), len(masks[0])
    block = torch.tensor(masks, dtype=torch.bool)  # [bs, n, n]
    if mode == TREE_MASK_QLEN_ONLY:
        tree_mask[: bs * n * n] = block.reshape(-1).to(tree_mask.dtype)
    elif mode == TREE_MASK_FULL:
        # Request b's rows are [n, seq_len_b + n]; the tree occupies the last n columns.
        offset = 0
        for b in range(bs):
            width = int(seq_lens[b]) + n
            view = tree_mask[offset : offset + n * width].view(n, width)
            view[:, int(seq_lens[b]) :] = block[b].to(tree_mask.dtype)
            offset += n * width
    elif mode == TREE_MASK_QLEN_ONLY_BITPACKING:
        # One integer per row; bit j set = node j visible.
        weights = torch.tensor([1 << j for j in range(n)], dtype=torch.int64)
        packed = (block.to(torch.int64) * weights).sum(dim=-1).reshape(-1)
        tree_mask[: bs * n] = packed.to(tree_mask.dtype)
    else:
        raise ValueError(f"unknown tree_mask_mode {mode}")


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy acceptance: follow the path whose draft tokens equal the target's argmax.

    Starting at the root, repeatedly look among the current node's children for one whose
    candidate token equals the target's prediction at the current node; accept it and
    descend, else stop. Writes (argument names keep sgl_kernel's ``retrive`` spelling,
    since callers pass them by keyword):

    * ``accept_index[b, :1 + accepted]``: flat rows of root + accepted nodes (rest untouched),
    * ``accept_token_num[b]``: number of accepted draft tokens (root excluded),
    * ``predicts[row]``: the target token at each accepted row, incl. the final bonus.
    """
    bs, n = candidates.shape
    max_accept = accept_index.shape[1]
    cand = candidates.tolist()
    rindex = retrive_index.reshape(bs, n).tolist()
    rnext = retrive_next_token.reshape(bs, n).tolist()
    rsib = retrive_next_sibling.reshape(bs, n).tolist()
    target = target_predict.reshape(-1).tolist()
    pred_rows: list[int] = []
    pred_vals: list[int] = []
    for b in range(bs):
        last_row = rindex[b][0]
        accept_index[b, 0] = last_row
        accepted = 0
        node = 0
        for _ in range(1, max_accept):
            want = target[last_row]
            child = rnext[b][node]
            while child != -1 and cand[b][child] != want:
                child = rsib[b][child]
            if child == -1:
                break
            pred_rows.append(last_row)
            pred_vals.append(want)
            accepted += 1
            last_row = rindex[b][child]
            accept_index[b, accepted] = last_row
            node = child
        accept_token_num[b] = accepted
        pred_rows.append(last_row)
        pred_vals.append(target[last_row])
    if pred_rows:
        flat = predicts.view(-1)
        flat[torch.tensor(pred_rows, dtype=torch.int64)] = torch.tensor(pred_vals, dtype=flat.dtype)


def fill_bonus_tokens(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[i] = accept_tokens.flat[i * accept_stride + accept_lens[i] - 1]``:
    the last accepted token of each request (accept_lens counts the bonus token)."""
    bs = accept_lens.shape[0]
    if bs == 0:
        return
    rows = torch.arange(bs, dtype=torch.int64, device=accept_lens.device) * accept_stride
    idx = rows + accept_lens.to(torch.int64) - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact the cache slots of accepted rows: for the k-th entry of ``accept_index``
    (flattened, in order) that is not -1, ``accept_out_cache_loc[k] = out_cache_loc[entry]``."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat != -1]
    if kept.numel():
        accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)
