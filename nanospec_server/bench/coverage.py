"""Figure 1b and the vocabulary's evolution, offline: `nanospec bench coverage`.

The target's greedy outputs come from a benchmark run (``ar``'s answers) or are generated
here with transformers; one forward pass over prompt + output gives the target's top-k at
every position. Then ``replay`` rebuilds the candidate stream for each W_max, and the
static FR-Spec list is cut at each k, so coverage can be set against vocabulary size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from nanospec_server.bench.api import _model_dir
from nanospec_server.bench.configs import size_label
from nanospec_server.bench.data import BenchPrompt, load_tasks
from nanospec_server.models.chat import encode_chat
from nanospec_server.vocab_tools.replay import ReplayStats, Sequence, replay, static_coverage

PAPER_COVERAGE = (0.73, 0.97)  # the paper's per-task range at its default W_max


def outputs_from_run(run_dir: Path) -> list[tuple[str, str, list[int], list[int]]]:
    """(prompt id, task, input ids, output ids) of ``ar``'s first turns in a run."""
    # deferred: imports transformers only when called
    from transformers import AutoTokenizer

    info = json.loads((run_dir / "run.json").read_text())
    s = info["settings"]
    tokenizer = AutoTokenizer.from_pretrained(_target_dir(s))
    prompts = {p.id: p for p in load_tasks(Path(s["specbench"]) if s["specbench"] else None,
                                           s["limit_per_task"], s["seed"], s["tasks"])}  # fmt: skip
    seen, out = set(), []
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("config") != "ar" or r["turn"] != 0 or r["concurrency"] != 1:
            continue
        for item in r["items"]:
            if item["prompt_id"] not in seen:
                seen.add(item["prompt_id"])
                ids = encode_chat(tokenizer, list(prompts[item["prompt_id"]].turns[:1]), [])
                out.append((item["prompt_id"], item["task"], ids, item["output_ids"]))
    return out


def _target_dir(settings: dict) -> str:
    return str(_model_dir(settings["target"], settings.get("tiny", False)))


def generate_outputs(model, tokenizer, prompts: list[BenchPrompt], max_new_tokens: int):
    out = []
    for p in tqdm(prompts, desc="greedy outputs", unit="prompt"):
        ids = encode_chat(tokenizer, list(p.turns[:1]), [])
        with torch.no_grad():
            full = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=tokenizer.eos_token_id)  # fmt: skip
        out.append((p.id, p.task, ids, full[0, len(ids) :].tolist()))
    return out


def coverage_tables(
    sequences: list[Sequence], vocab_size: int, w_maxes: list[int], static_ks: list[int],
    ranked_ids: list[int], step_tokens: int, eos: tuple[int, ...],
) -> dict:  # fmt: skip
    """NanoSpec (per W_max: coverage, mean |I|, per task) and static top-k coverage."""
    tasks = list(dict.fromkeys(s.task for s in sequences))
    nanospec = []
    for w in tqdm(w_maxes, desc="replay W_max", unit="W"):
        per_task = {t: ReplayStats() for t in tasks}
        for s in sequences:
            per_task[s.task].add(
                replay(s, vocab_size, w, step_tokens=step_tokens, always_active=eos)
            )
        total = ReplayStats()
        for stats in per_task.values():
            total.add(stats)
        nanospec.append({"w_max": w, "coverage": total.coverage, "mean_active": total.mean_active,
                         "per_task": {t: x.coverage for t, x in per_task.items()}})  # fmt: skip
    static = [{"k": k, "coverage": static_coverage(sequences, ranked_ids, k),
               "per_task": {t: static_coverage([s for s in sequences if s.task == t], ranked_ids, k)
                            for t in tasks}} for k in static_ks]  # fmt: skip
    return {"nanospec": nanospec, "static": static}


def evolution(seq: Sequence, vocab_size: int, w_max: int, step_tokens: int, eos) -> dict:
    stats = replay(seq, vocab_size, w_max, step_tokens=step_tokens, always_active=eos, trace=True)
    return {"prompt_len": len(seq.prompt), "output_len": len(seq.output), "w_max": w_max,
            "sizes": stats.sizes, "turnover": stats.turnover}  # fmt: skip


def write_outputs(out_dir: Path, result: dict, default_w: int) -> Path:
    # deferred: imports matplotlib only when called
    import matplotlib

    matplotlib.use("Agg")
    # deferred: imports matplotlib only when called
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "coverage.json").write_text(json.dumps(result, indent=2))
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=80)
    n = result["tables"]["nanospec"]
    s = result["tables"]["static"]
    ax.plot(
        [x["mean_active"] for x in n],
        [x["coverage"] for x in n],
        "o-",
        label="NanoSpec (W_max sweep)",
    )
    ax.plot([x["k"] for x in s], [x["coverage"] for x in s], "s--", label="static top-k (FR-Spec)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("draft vocabulary size (NanoSpec: mean |I|)")
    ax.set_ylabel("coverage")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "fig1b_coverage.png")
    plt.close(fig)
    ev = result["evolution"]
    fig, ax = plt.subplots(figsize=(6, 2.8), dpi=80)
    ax.plot(ev["sizes"], label="|I|")
    ax.plot(ev["turnover"], label="turnover (entered + left)")
    ax.set_xlabel("decoding step")
    ax.set_title(f"active vocabulary over one generation (W_max {ev['w_max']})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "evolution.png")
    plt.close(fig)
    lines = [f"# Coverage (offline replay): {result['target']}", "",
             f"- command: `{result['provenance']['command']}`",
             f"- {len(result['sequences'])} sequences, step of {result['step_tokens']} token(s), "
             f"K_pre = K_ver = 3; paper's per-task range {PAPER_COVERAGE[0]:.0%}-{PAPER_COVERAGE[1]:.0%}", "",
             "| vocabulary | mean size | coverage | " + " | ".join(n[0]["per_task"]) + " |",
             "|---|---|---|" + "---|" * len(n[0]["per_task"])]  # fmt: skip
    for x in n:
        tag = " (default)" if x["w_max"] == default_w else ""
        cells = " | ".join(f"{v:.3f}" if v is not None else "-" for v in x["per_task"].values())
        lines.append(
            f"| NanoSpec W_max {x['w_max']}{tag} | {x['mean_active']:.0f} | {x['coverage']:.3f} | {cells} |"
        )
    for x in s:
        cells = " | ".join(f"{v:.3f}" if v is not None else "-" for v in x["per_task"].values())
        lines.append(
            f"| static top-{size_label(x['k'])} | {x['k']} | {x['coverage']:.3f} | {cells} |"
        )
    sizes, turnover = ev["sizes"], ev["turnover"]
    lines += ["", f"Evolution over {ev['output_len']} output tokens after a {ev['prompt_len']}-token prompt: "
              f"|I| {sizes[0]} -> {sizes[-1]} (max {max(sizes)}), mean turnover per step "
              f"{sum(turnover) / len(turnover):.1f} tokens.", "",
              "![fig1b](fig1b_coverage.png)", "![evolution](evolution.png)"]  # fmt: skip
    path = out_dir / "coverage.md"
    path.write_text("\n".join(lines) + "\n")
    return path
