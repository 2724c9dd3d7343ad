"""Record every request's candidate stream as served, for the GPU cost model.

Off unless ``NANOSPEC_RECORD_STREAMS`` names a file. Each append to the vocabulary becomes
one JSON line ``{"rid", "kind": "prefill"|"step", "tokens": [...]}`` (valid tokens only,
in stream order; a step's line also has the ``position`` of its draft tree's root and
its ``tree_size``, the draft tree's tokens that lead the line). It reads the tokens to the host once per append: a benchmark tool, not
for serving.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

from nanospec_server.env import record_streams


class StreamRecorder:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def from_env(cls) -> StreamRecorder | None:
        path = record_streams()
        return cls(Path(path)) if path else None

    def record(
        self,
        rids: list[str],
        kind: str,
        tokens: Tensor,
        valid: Tensor | None,
        positions: list[int] | None = None,
        tree_size: int | None = None,
    ) -> None:
        """``positions``: where each request's step started (its draft tree's root);
        ``tree_size``: how many of the step's tokens are its draft tree (1: no draft)."""
        rows = tokens.tolist()
        masks = valid.tolist() if valid is not None else [[True] * len(r) for r in rows]
        with self.path.open("a") as out:
            for i, (rid, row, mask) in enumerate(zip(rids, rows, masks, strict=True)):
                kept = [t for t, keep in zip(row, mask, strict=True) if keep]
                line = {"rid": rid, "kind": kind, "tokens": kept}
                if positions is not None:
                    line["position"] = positions[i]
                if tree_size is not None:
                    line["tree_size"] = tree_size
                out.write(json.dumps(line) + "\n")
