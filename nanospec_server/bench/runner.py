"""Run a schedule against real `nanospec serve` processes, one per configuration.

Each group's servers start together and stay up while every batch of the group is sent;
each finished batch is stored at once (``store.py``), so a rerun with the same ``--out``
skips what is done. Before a group's servers stop, every output that differs from plain
decoding is probed on the ``ar`` server for the target's log-probabilities of both
candidates at the first differing position, so a bf16 near-tie can be told from a bug.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from tqdm import tqdm

from nanospec_server.bench.configs import AR, BenchConfig
from nanospec_server.bench.data import BenchPrompt
from nanospec_server.bench.schedule import Batch, anchor_group
from nanospec_server.bench.store import ResultStore
from nanospec_server.launch.server import generate, running_servers
from nanospec_server.models.chat import encode_chat

# sender(batch, input ids per prompt) -> items (one per prompt) and the batch's wall time
Sender = Callable[[Batch, list[list[int]]], tuple[list[dict], float]]


def item_from_response(prompt: BenchPrompt, input_len: int, response: dict, latency: float) -> dict:
    meta = response["meta_info"]
    stats = meta.get("nanospec") or [None]
    verifies = meta.get("spec_verify_ct") or 0
    return {
        "prompt_id": prompt.id,
        "task": prompt.task,
        "input_len": input_len,
        "output_ids": response["output_ids"],
        "completion_tokens": meta["completion_tokens"],
        "latency_s": latency,
        "verify_steps": verifies,
        # SGLang's own count: tokens per verification, bonus token included.
        "accept_length": meta.get("spec_accept_length") if verifies else None,
        "nanospec": stats[-1],
    }


class SideBySide:
    def __init__(
        self,
        configs: list[BenchConfig],
        config_groups: list[list[str]],
        prompts: list[BenchPrompt],
        tokenizer,
        store: ResultStore,
        max_new_tokens: int,
    ) -> None:
        self.configs = {c.name: c for c in configs}
        self.prompts = {p.id: p for p in prompts}
        self.tokenizer, self.store, self.max_new_tokens = tokenizer, store, max_new_tokens
        # group -> the group whose ar it is compared with
        self.ar_of = {g: anchor_group(config_groups, g, AR) for g in range(len(config_groups))}

    # -- prompts ------------------------------------------------------------------------

    def first_answer(self, group: int, prompt_id: str) -> str:
        """``ar``'s answer to the first turn: what the second turn follows."""
        ar_group = self.ar_of[group]
        for record in self.store.records.values():
            if (
                record.get("group") == ar_group
                and record.get("config") == AR
                and record.get("turn") == 0
            ):
                for item in record["items"]:
                    if item["prompt_id"] == prompt_id:
                        return self.tokenizer.decode(item["output_ids"], skip_special_tokens=True)
        raise RuntimeError(f"no first answer of {AR} for {prompt_id} in group {group}")  # fmt: skip

    def input_ids(self, group: int, prompt_id: str, turn: int) -> list[int]:
        prompt = self.prompts[prompt_id]
        answers = [self.first_answer(group, prompt_id)] if turn else []
        return encode_chat(self.tokenizer, list(prompt.turns[: turn + 1]), answers)

    # -- running ------------------------------------------------------------------------

    def execute(self, batches: list[Batch], sender: Sender) -> None:
        """Send every batch not yet stored, storing each as it finishes."""
        todo = [b for b in batches if b.key not in self.store]
        for batch in tqdm(todo, desc="bench", unit="batch", initial=len(batches) - len(todo),
                          total=len(batches)):  # fmt: skip
            ids = [self.input_ids(batch.group, p, batch.turn) for p in batch.prompt_ids]
            items, wall = sender(batch, ids)
            self.store.add({"key": batch.key, "group": batch.group, "config": batch.config,
                            "turn": batch.turn, "repeat": batch.repeat,
                            "concurrency": batch.concurrency, "wall_s": wall, "items": items})  # fmt: skip

    def run(
        self, batches: list[Batch], base_flags: list[str], log_dir: Path, one_at_a_time: bool
    ) -> None:
        """Start each group's servers (``one_at_a_time``: for real models, see
        `running_servers`), send its batches, probe its divergences, stop."""
        log_dir.mkdir(parents=True, exist_ok=True)
        for group in sorted({b.group for b in batches}):
            mine = [b for b in batches if b.group == group]
            if all(b.key in self.store for b in mine) and self._probed(group):
                continue
            names = list(dict.fromkeys(b.config for b in mine))
            servers = {
                name: (
                    base_flags + list(self.configs[name].flags),
                    log_dir / f"g{group}-{name}.log",
                )
                for name in names
            }
            with running_servers(servers, one_at_a_time) as urls:
                print(f"nanospec bench: group {group} up: {', '.join(urls)}", flush=True)
                self.execute(mine, self._http_sender(urls))
                # A server alone probes with its own target: a prompt's logits do not
                # depend on the draft.
                self.probe_divergences(group, urls.get(AR) or next(iter(urls.values())))

    def _http_sender(self, urls: dict[str, str]) -> Sender:
        def send(batch: Batch, input_ids: list[list[int]]) -> tuple[list[dict], float]:
            url = urls[batch.config]

            def one(prompt_id: str, ids: list[int]) -> dict:
                start = time.perf_counter()
                response = generate(url, ids, self.max_new_tokens)
                latency = time.perf_counter() - start
                return item_from_response(self.prompts[prompt_id], len(ids), response, latency)

            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=len(input_ids)) as pool:
                items = list(pool.map(one, batch.prompt_ids, input_ids))
            return items, time.perf_counter() - start

        return send

    # -- lossless check -----------------------------------------------------------------

    def divergences(self, group: int) -> list[dict]:
        """Outputs of this group that differ from ``ar``'s for the same prompt and turn."""
        plain = {}
        ar_group = self.ar_of[group]
        for r in self.store.records.values():
            if r.get("group") == ar_group and r.get("config") == AR:
                for item in r["items"]:
                    plain[(r["turn"], r["repeat"], r["concurrency"], item["prompt_id"])] = item
        found = []
        for r in self.store.records.values():
            if r.get("group") != group or r.get("config") in (AR, None):
                continue
            for item in r["items"]:
                key = (r["turn"], r["repeat"], r["concurrency"], item["prompt_id"])
                reference = plain.get(key)
                if reference is None or reference["output_ids"] == item["output_ids"]:
                    continue
                a, b = reference["output_ids"], item["output_ids"]
                first = next(
                    (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)),
                )
                found.append({"config": r["config"], "turn": r["turn"], "repeat": r["repeat"],
                              "concurrency": r["concurrency"], "prompt_id": item["prompt_id"],
                              "position": first, "ar_token": a[first] if first < len(a) else None,
                              "config_token": b[first] if first < len(b) else None})  # fmt: skip
        return found

    def _probe_key(self, group: int) -> str:
        return f"probe|g{group}"

    def _probed(self, group: int) -> bool:
        return self._probe_key(group) in self.store

    def probe_divergences(self, group: int, ar_url: str) -> None:
        """The target's log-probabilities of both candidates where each divergence starts
        (their difference is the difference of the logits)."""
        found = self.divergences(group)
        for d in found:
            candidates = [t for t in (d["ar_token"], d["config_token"]) if t is not None]
            if not candidates:
                continue
            ids = self.input_ids(group, d["prompt_id"], d["turn"])
            reference = self._ar_output(group, d)
            try:
                prefix = ids + reference[: d["position"]]
                d["logprobs"] = _candidate_logprobs(ar_url, prefix, candidates)
            except (requests.RequestException, LookupError, TypeError, ValueError) as error:
                d["probe_error"] = str(error)  # the count stands; only the logits are missing
            d["text"] = {str(t): self.tokenizer.decode([t]) for t in candidates}
        self.store.add({"key": self._probe_key(group), "group": group, "divergences": found})

    def _ar_output(self, group: int, d: dict) -> list[int]:
        for r in self.store.records.values():
            if (r.get("group"), r.get("config"), r.get("turn"), r.get("repeat"),
                    r.get("concurrency")) == (self.ar_of[group], AR, d["turn"], d["repeat"], d["concurrency"]):  # fmt: skip
                for item in r["items"]:
                    if item["prompt_id"] == d["prompt_id"]:
                        return item["output_ids"]
        return []


def _candidate_logprobs(url: str, input_ids: list[int], tokens: list[int]) -> dict[str, float]:
    response = requests.post(f"{url}/generate", timeout=300, json={
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
        "return_logprob": True, "logprob_start_len": -1, "token_ids_logprob": tokens,
    })  # fmt: skip
    response.raise_for_status()
    # [[(logprob, token id, text)]] for the one generated position
    entries = response.json()["meta_info"]["output_token_ids_logprobs"][0]
    return {str(token): logprob for logprob, token, *_ in entries}
