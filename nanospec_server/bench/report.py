"""A run's Markdown report, ``summary.json`` and PNG figures, written into the run directory."""

from __future__ import annotations

import json
from pathlib import Path

from nanospec_server.bench.configs import AR, DEFAULT_W_MAX, parse_size
from nanospec_server.bench.summary import OVERALL, lossless, summarize


def _f(value, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _ratio(r: dict | None) -> str:
    if not r or r["median"] is None:
        return "-"
    low, high = r["spread"]
    return f"{r['median']:.2f}x [{low:.2f}-{high:.2f}]"


def write_report(run_dir: Path) -> Path:
    info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]  # fmt: skip
    references = info["references"]
    side_by_side = any(len(g) > 1 for g in info.get("groups", [[]]))
    summary = summarize(records, references, side_by_side)
    checks = lossless(records, bitwise_expected=info.get("bitwise_expected", False))
    (run_dir / "summary.json").write_text(
        json.dumps({"run": info, "results": summary, "lossless": checks}, indent=2)
    )
    figures = write_figures(run_dir, summary, info)
    s = info["settings"]
    lines = [
        f"# nanospec bench: {run_dir.name}", "",
        f"- command: `{info['command']}`",
        f"- versions: {', '.join(f'{k} {v}' for k, v in info['versions'].items() if v)}",
        f"- hardware: {info['hardware']}",
        *([] if side_by_side else ["- one server at a time (`--max-servers 1`): ratios are "
                                   "taken across consecutive servers, not side by side"]),
        f"- target: `{s['target']}`, dtype {s['dtype']}, greedy, max new tokens **{s['max_new_tokens']}**, "
        f"{s['limit_per_task'] or 'all'} prompt(s) per task (seed {s['seed']}), {s['repeats']} repeat(s), "
        f"concurrency {s['concurrency']}",
        f"- prompts: {', '.join(info['prompts'])}", "",
    ]  # fmt: skip
    for c, table in summary.items():
        lines += _main_table(c, table)
        lines += _task_table(c, table)
    lines += _ablation_table(summary)
    lines += _prior_table(summary)
    lines += _load_table(summary)
    lines += _lossless_section(checks)
    lines += [f"![{f.stem}]({f.name})" for f in figures]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _main_table(c: int, table: dict) -> list[str]:
    lines = [f"## Overall, concurrency {c}", "",
             "| config | tokens/s | vs ar [IQR] | vs full vocab [IQR] | accept | ms/step | draft ms/step | LM-head share | coverage | mean active vocab | LM-head rows (of V) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for config, cells in table.items():
        x = cells[OVERALL]
        rows = f"{_f(x['lm_head_rows'], 0)} ({x['vocab_size']})" if x["lm_head_rows"] else "-"
        lines.append(
            f"| {config} | {_f(x['tokens_per_s'])} | {_ratio(x['vs_ar'])} | {_ratio(x['vs_full'])} "
            f"| {_f(x['accept_length'])} | {_f(x['ms_per_step'], 0)} | {_f(x['draft_ms_per_step'], 0)} "
            f"| {_share(x['lm_head_share'])} | {_f(x['coverage'], 3)} "
            f"| {_f(x['active_vocab'], 0)} | {rows} |"
        )
    return lines + [""]


def _task_table(c: int, table: dict) -> list[str]:
    tasks = [t for t in next(iter(table.values())) if t != OVERALL]
    if not tasks:
        return []
    lines = [f"### Per task, concurrency {c}: tokens/s, speed-up over ar, acceptance, coverage", "",
             "| config | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]  # fmt: skip
    for config, cells in table.items():
        row = []
        for t in tasks:
            x = cells.get(t)
            if x is None:
                row.append("-")
                continue
            parts = [_f(x["tokens_per_s"])]
            if x["vs_ar"]:
                parts.append(_f(x["vs_ar"]["median"], 2, "x"))
            if x["accept_length"]:
                parts.append(f"τ {_f(x['accept_length'])}")
            if x["coverage"] is not None:
                parts.append(f"cov {_f(x['coverage'], 2)}")
            row.append(" / ".join(parts))
        lines.append(f"| {config} | " + " | ".join(row) + " |")
    return lines + [""]


def _ablation_table(summary: dict) -> list[str]:
    table = summary.get(1, {})
    names = [n for n in table if n.rsplit("-", 1)[-1] in ("full", "nanospec", "only", "sync")]
    if len([n for n in names if n.endswith(("ctx-only", "ext-only", "sync"))]) == 0:
        return []
    lines = ["## Ablations (Table 5), concurrency 1", "",
             "| config | accept | coverage | mean active vocab | vs full vocab |", "|---|---|---|---|---|"]  # fmt: skip
    for n in names:
        x = table[n][OVERALL]
        lines.append(f"| {n} | {_f(x['accept_length'])} | {_f(x['coverage'], 3)} "
                     f"| {_f(x['active_vocab'], 0)} | {_ratio(x['vs_full'])} |")  # fmt: skip
    return lines + [""]


def _prior_table(summary: dict) -> list[str]:
    """The hybrid vocabulary (window plus a static prior of k tokens) against k = 0."""
    lines = []
    for c, table in summary.items():
        priors = [n for n in table if _prior(n)]
        if not priors:
            continue
        bases = list(dict.fromkeys(n.rsplit("-p", 1)[0] for n in priors))
        lines += [f"## Hybrid vocabulary (window + prior of k tokens), concurrency {c}", "",
                  "| config | prior k | coverage | accept | LM-head rows | tokens/s | vs ar [IQR] | vs full vocab [IQR] |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for base in bases:
            for n in [base, *(p for p in priors if p.rsplit("-p", 1)[0] == base)]:
                x = table.get(n, {}).get(OVERALL)
                if x is None:
                    continue
                lines.append(f"| {n} | {_prior(n)} | {_f(x['coverage'], 3)} | {_f(x['accept_length'])} "
                             f"| {_f(x['lm_head_rows'], 0)} | {_f(x['tokens_per_s'])} | {_ratio(x['vs_ar'])} "
                             f"| {_ratio(x['vs_full'])} |")  # fmt: skip
        lines.append("")
    return lines


def _load_table(summary: dict) -> list[str]:
    """Throughput and latency as concurrency rises, where adaptive speculation ran."""
    configs = list(dict.fromkeys(n for table in summary.values() for n in table))
    if not any(n.endswith("-adaptive") for n in configs):
        return []
    lines = ["## Under load: total throughput and per-request latency by concurrency", "",
             "| config | concurrency | tokens/s (all requests) | vs ar [IQR] | latency median s | latency p90 s | accept |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for n in configs:
        for c, table in summary.items():
            x = table.get(n, {}).get(OVERALL)
            if x is None:
                continue
            lines.append(f"| {n} | {c} | {_f(x['tokens_per_s'])} | {_ratio(x['vs_ar'])} "
                         f"| {_f(x['latency_median_s'])} | {_f(x['latency_p90_s'])} "
                         f"| {_f(x['accept_length'])} |")  # fmt: skip
    return lines + [""]


def _lossless_section(checks: dict) -> list[str]:
    lines = ["## Lossless check (outputs differing from ar)", ""]
    if checks["bitwise_expected"]:
        lines += ["fp32 or bf16 on a CPU through our kernels: speculation is bit-identical to plain "
                  f"decoding here, so every differing output is a bug (**{checks['bugs']}**).", ""]  # fmt: skip
    lines += ["| config | outputs | differing |", "|---|---|---|"]
    for config, c in checks["compared"].items():
        lines.append(f"| {config} | {c['outputs']} | {c['differing']} |")
    for d in checks["divergences"]:
        logprobs = d.get("logprobs", {})
        gap = ""
        a, b = str(d["ar_token"]), str(d["config_token"])
        if a in logprobs and b in logprobs:
            gap = f", target log-prob gap {logprobs[a] - logprobs[b]:.4f}"
        elif "probe_error" in d:
            gap = f" (probe failed: {d['probe_error']})"
        lines.append(
            f"- {d['config']} on {d['prompt_id']} (turn {d['turn'] + 1}, c{d['concurrency']}): "
            f"first differs at token {d['position']}: ar {d['ar_token']} {d.get('text', {}).get(a, '')!r} "
            f"vs {d['config_token']} {d.get('text', {}).get(b, '')!r}; log-probs {logprobs}{gap}"
        )  # fmt: skip
    return lines + [""]


def write_figures(run_dir: Path, summary: dict, info: dict) -> list[Path]:
    # deferred: imports matplotlib only when called
    import matplotlib

    matplotlib.use("Agg")
    # deferred: imports matplotlib only when called
    import matplotlib.pyplot as plt

    out = []
    for c, table in summary.items():
        tasks = [t for t in next(iter(table.values()))]
        for metric, label in (("tokens_per_s", "tokens/s (prefill included)"),
                              ("accept_length", "acceptance length"), ("coverage", "coverage")):  # fmt: skip
            configs = [n for n in table if any(table[n].get(t, {}).get(metric) for t in tasks)]
            if not configs:
                continue
            fig, ax = plt.subplots(figsize=(8, 3.2), dpi=80)
            width = 0.8 / len(configs)
            for j, n in enumerate(configs):
                values = [table[n].get(t, {}).get(metric) or 0 for t in tasks]
                ax.bar([i + j * width for i in range(len(tasks))], values, width, label=n)
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks, fontsize=8)
            ax.set_ylabel(label)
            ax.legend(fontsize=6, ncol=3)
            ax.set_title(f"{label}, concurrency {c}", fontsize=9)
            fig.tight_layout()
            out.append(run_dir / f"{metric}_c{c}.png")
            fig.savefig(out[-1])
            plt.close(fig)
    out += _sweep_figures(run_dir, summary.get(1, {}), plt)
    out += _load_figure(run_dir, summary, plt)
    return out


def _load_figure(run_dir: Path, summary: dict, plt) -> list[Path]:
    """Throughput and median latency against concurrency, one line per configuration."""
    configs = list(dict.fromkeys(n for table in summary.values() for n in table))
    if not any(n.endswith("-adaptive") for n in configs) or len(summary) < 2:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(9, 3), dpi=80)
    for n in configs:
        points = [(c, t[n][OVERALL]) for c, t in sorted(summary.items()) if n in t]
        cs = [c for c, _ in points]
        axes[0].plot(cs, [x["tokens_per_s"] or 0 for _, x in points], "o-", label=n)
        axes[1].plot(cs, [x["latency_median_s"] or 0 for _, x in points], "o-", label=n)
    for ax, label in zip(
        axes, ("tokens/s, all requests", "median request latency, s"), strict=True
    ):
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = run_dir / "load.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


def _sweep_figures(run_dir: Path, table: dict, plt) -> list[Path]:
    """Figure 1a (static top-k: oracle vs actual) and Figure 6 (W_max), when run."""
    out = []
    for draft in {n.split("-", 1)[0] for n in table if n != AR}:
        full = table.get(f"{draft}-full", {}).get(OVERALL)
        static = sorted(
            (int(_k(n)), table[n][OVERALL])
            for n in table
            if n.startswith(f"{draft}-static-") and n != f"{draft}-static-tpe"
        )
        if full and static and full["accept_length"]:
            fig, ax = plt.subplots(figsize=(5, 3), dpi=80)
            ks = [k for k, _ in static]
            actual = [x["tokens_per_s"] for _, x in static]
            # Oracle: the step time measured at k with the full vocabulary's acceptance.
            oracle = [
                x["tokens_per_s"] * full["accept_length"] / x["accept_length"] for _, x in static
            ]
            ax.plot(ks, actual, "o-", label="actual")
            ax.plot(ks, oracle, "s--", label="oracle (full-vocab acceptance)")
            ax.axhline(full["tokens_per_s"], color="gray", ls=":", label="full vocabulary")
            for n in table:  # NanoSpec and the TPE-trimmed map where their rows put them
                x = table[n][OVERALL]
                own_size = n.startswith(f"{draft}-nanospec") or n == f"{draft}-static-tpe"
                if own_size and x["lm_head_rows"] and x["tokens_per_s"]:
                    ax.plot(x["lm_head_rows"], x["tokens_per_s"], "*", ms=10, label=n)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("draft vocabulary size (LM-head rows)")
            ax.set_ylabel("tokens/s")
            ax.legend(fontsize=7)
            fig.tight_layout()
            out.append(run_dir / f"fig1a_{draft}.png")
            fig.savefig(out[-1])
            plt.close(fig)
        sweep = sorted(
            (_w(n), table[n][OVERALL])
            for n in table
            if n.startswith(f"{draft}-nanospec") and not _prior(n) and not n.endswith("-adaptive")
        )
        if len(sweep) > 1:
            fig, axes = plt.subplots(1, 3, figsize=(9, 2.8), dpi=80)
            for ax, metric in zip(axes, ("coverage", "accept_length", "tokens_per_s"), strict=True):
                ax.plot([w for w, _ in sweep], [x[metric] or 0 for _, x in sweep], "o-")
                ax.set_xscale("log", base=2)
                ax.set_xlabel("W_max")
                ax.set_title(metric, fontsize=9)
            fig.tight_layout()
            out.append(run_dir / f"fig6_wmax_{draft}.png")
            fig.savefig(out[-1])
            plt.close(fig)
    return out


def _k(name: str) -> int:
    return parse_size(name.rsplit("-", 1)[-1])


def _w(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail[1:]) if tail.startswith("w") and tail[1:].isdigit() else DEFAULT_W_MAX


def _prior(name: str) -> int:
    """k of a hybrid configuration (``...-p2048``), 0 for the others."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail[1:]) if tail.startswith("p") and tail[1:].isdigit() else 0
