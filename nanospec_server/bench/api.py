"""`run_bench`: the Python API under `nanospec bench run`.

settings = BenchSettings(limit_per_task=1, max_new_tokens=32)
run_dir = run_bench(settings)            # resumes if run_dir already holds part of it
print((run_dir / "report.md").read_text())
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from nanospec_server import host
from nanospec_server.bench.configs import (
    AR,
    DEFAULT_W_MAX,
    build_configs,
    build_token_maps,
    default_token_map_corpus,
    drafts_for,
    full_vocab_reference,
)
from nanospec_server.bench.data import TASKS, load_tasks
from nanospec_server.bench.provenance import bench_root, provenance
from nanospec_server.bench.report import write_report
from nanospec_server.bench.runner import SideBySide
from nanospec_server.bench.schedule import groups, plan
from nanospec_server.bench.store import ResultStore
from nanospec_server.models.prepare import prepare_model

# The paper's analyses as configuration presets (Figure 1a, Figure 6, Table 5).
ANALYSES = {
    "main": {"modes": ["full", "static", "nanospec", "ctx-only", "ext-only", "sync"]},
    "vocab-sweep": {"modes": ["full", "static"],
                    "static_ks": [32768, 16384, 8192, 4096, 2048, 1024, 512]},
    "wmax": {"modes": ["full", "nanospec"], "w_maxes": [256, 512, 1024, 2048, 3072, 4096, 8192]},
    "ablation": {"modes": ["full", "nanospec", "ctx-only", "ext-only", "sync"]},
    "prior": {"modes": ["full", "nanospec"], "prior_ks": [0, 512, 2048, 8192]},
    # Under load: plain decoding, fixed-depth NanoSpec speculation and the same with
    # --nanospec-adaptive, at rising concurrency.
    "adaptive": {"modes": ["nanospec"], "adaptive": True, "concurrency": [1, 4, 8, 16]},
}  # fmt: skip


@dataclass
class BenchSettings:
    target: str = "qwen2.5-coder-1.5b-instruct"  # registry name or model directory
    standalone: list[str] = field(default_factory=lambda: ["qwen2.5-coder-0.5b-instruct"])
    eagle: list[str] = field(default_factory=list)
    eagle3: list[str] = field(default_factory=list)  # EAGLE-3 heads (SpecForge's layout)
    # draft tree shapes: (steps, top-k, draft tokens), each a configuration of every draft
    shapes: list[tuple[int, int, int]] = field(default_factory=lambda: [(4, 1, 5)])
    modes: list[str] = field(default_factory=lambda: list(ANALYSES["main"]["modes"]))
    static_ks: list[int] = field(default_factory=lambda: [32768])
    w_maxes: list[int] = field(default_factory=lambda: [DEFAULT_W_MAX])
    prior_ks: list[int] = field(default_factory=lambda: [0])  # hybrid vocabulary sizes
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    limit_per_task: int | None = 2
    seed: int = 0
    repeats: int = 1
    concurrency: list[int] = field(default_factory=lambda: [1])
    max_new_tokens: int = 64
    dtype: str = "bfloat16"
    max_servers: int | None = None
    max_total_tokens: int = 16384
    # SGLang checks this share of the memory it finds free at start against the weights;
    # --max-total-tokens, not this, bounds each server's KV pool.
    mem_fraction_static: float = 0.9
    specbench: str | None = None
    token_map_corpus: list[str] = field(default_factory=list)
    tpe_token_map: str | None = None  # `nanospec vocab trim`'s map: one more static config
    tiny: bool = False
    adaptive: bool = False  # each nanospec configuration also with --nanospec-adaptive

    def digest(self) -> str:
        values = dataclasses.asdict(self)
        if values["tpe_token_map"] is None:  # runs from before the field keep their directory
            del values["tpe_token_map"]
        if not values["adaptive"]:
            del values["adaptive"]  # runs from before the field keep their directory
        if not values["eagle3"]:  # runs from before EAGLE-3 heads keep their directories
            del values["eagle3"]
        return hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]


def default_run_dir(settings: BenchSettings) -> Path:
    return bench_root() / f"run-{settings.digest()}"


def _model_dir(name_or_path: str, tiny: bool) -> Path:
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if tiny:
        # deferred: imports torch only when called
        from nanospec_server.models.tiny import tiny_model_path

        return tiny_model_path(name_or_path)

    return prepare_model(name_or_path)


def run_bench(settings: BenchSettings, run_dir: Path | None = None) -> Path:
    # deferred: imports transformers only when called
    from transformers import AutoTokenizer

    run_dir = run_dir or default_run_dir(settings)
    # First, so that a bad data file fails before any model is prepared.
    prompts = load_tasks(Path(settings.specbench) if settings.specbench else None,
                         settings.limit_per_task, settings.seed, settings.tasks)  # fmt: skip
    store = ResultStore(run_dir)
    target = _model_dir(settings.target, settings.tiny)
    shapes = [tuple(s) for s in settings.shapes]
    drafts = drafts_for("EAGLE", [_model_dir(p, settings.tiny) for p in settings.eagle], shapes)
    drafts += drafts_for("EAGLE3", [_model_dir(p, settings.tiny) for p in settings.eagle3], shapes)  # fmt: skip
    drafts += drafts_for("STANDALONE", [_model_dir(p, settings.tiny) for p in settings.standalone], shapes)  # fmt: skip
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    run_dir.mkdir(parents=True, exist_ok=True)
    token_maps = {}
    if "static" in settings.modes:
        corpus = [Path(p) for p in settings.token_map_corpus] or default_token_map_corpus()
        token_maps = build_token_maps(target, settings.static_ks, vocab_size, run_dir, corpus)
    tpe_map = Path(settings.tpe_token_map) if settings.tpe_token_map else None
    configs = build_configs(
        drafts, settings.modes, settings.static_ks, settings.w_maxes, token_maps, settings.prior_ks,
        tpe_token_map=tpe_map, adaptive=settings.adaptive,
    )  # fmt: skip
    references = {c.name: full_vocab_reference(configs, c) for c in configs}
    anchors = [AR] + [n for n in dict.fromkeys(references.values()) if n]
    config_groups = groups([c.name for c in configs], anchors, settings.max_servers)
    batches = plan(config_groups, {p.id: len(p.turns) for p in prompts},
                   settings.repeats, settings.concurrency)  # fmt: skip
    info = provenance(json.loads(json.dumps(dataclasses.asdict(settings))))
    info |= {"configs": {c.name: list(c.flags) for c in configs}, "references": references,
             "groups": config_groups, "prompts": [p.id for p in prompts],
             "bitwise_expected": host.bitwise_lossless(settings.dtype)}  # fmt: skip
    store.start(info)
    base = ["--model-path", str(target), "--dtype", settings.dtype,
            "--max-total-tokens", str(settings.max_total_tokens), "--mem-fraction-static", str(settings.mem_fraction_static)]  # fmt: skip
    bench = SideBySide(configs, config_groups, prompts, AutoTokenizer.from_pretrained(str(target)), store,
                       settings.max_new_tokens)  # fmt: skip
    bench.run(batches, base, run_dir / "logs", one_at_a_time=not settings.tiny)
    write_report(run_dir)
    return run_dir
