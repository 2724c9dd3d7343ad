"""The configurations a benchmark compares, each a set of `nanospec serve` flags.

Every configuration serves the same target with the same engine settings; they differ
only in speculation: plain decoding (``ar``), a draft (EAGLE head or STANDALONE model)
with the full vocabulary, FR-Spec static top-k, NanoSpec, and the paper's ablations.
Names read ``<draft>-<mode>[-<size>]``: ``standalone-static-32k``, ``eagle-nanospec-w512``;
the hybrid vocabulary (window plus a static prior of k tokens, ``--nanospec-prior-k``)
adds ``-p<k>``: ``standalone-nanospec-p2048``. A token map from `nanospec vocab trim`
(coverage-latency trimming, TPE) is one more static configuration: ``eagle-static-tpe``.
Several drafts of one kind are numbered
(``eagle2-full``), several tree shapes tagged (``eagle_4x4x8-full``).

EAGLE-3 heads (``Draft("EAGLE3", ...)``, named ``eagle3-<mode>``) run every mode too;
their ``static`` is the head's own d2t vocabulary, named by its size (``eagle3-static-16k``;
no token map: SGLang ignores one under EAGLE-3), and a head without d2t gets no static
configuration, which the server would refuse.
"""

from __future__ import annotations

import argparse
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from nanospec_server import host
from nanospec_server.launch.server import speculative_flags

AR = "ar"
MODES = ("full", "static", "nanospec", "ctx-only", "ext-only", "sync")
DEFAULT_W_MAX = 3072


@dataclass(frozen=True)
class Draft:
    algorithm: str  # "EAGLE", "EAGLE3" or "STANDALONE"
    path: Path
    steps: int = 4
    topk: int = 1
    tokens: int = 5
    tag: str = ""  # tells drafts of one kind apart in names (no "-": names split on it)

    @property
    def label(self) -> str:
        return self.algorithm.lower() + self.tag


def drafts_for(
    algorithm: str, paths: list[Path], shapes: list[tuple[int, int, int]]
) -> list[Draft]:
    """One draft per model and tree shape, numbered and tagged only where needed."""
    drafts = []
    for i, path in enumerate(paths):
        for shape in shapes:
            tag = str(i + 1) if len(paths) > 1 else ""
            tag += "_" + "x".join(map(str, shape)) if len(shapes) > 1 else ""
            drafts.append(Draft(algorithm, path, *shape, tag=tag))
    return drafts


@dataclass(frozen=True)
class BenchConfig:
    name: str
    draft: Draft | None = None
    mode: str | None = None
    static_k: int | None = None
    w_max: int = DEFAULT_W_MAX
    prior_k: int = 0
    adaptive: bool = False  # --nanospec-adaptive: each step's depth from the goodput policy
    flags: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_ar(self) -> bool:
        return self.draft is None


def size_label(k: int) -> str:
    return f"{k // 1024}k" if k % 1024 == 0 else str(k)


def parse_size(text: str) -> int:
    """``32k`` -> 32768, ``512`` -> 512."""
    text = text.strip().lower()
    value = int(text[:-1]) * 1024 if text.endswith("k") else int(text)
    if value < 1:
        raise ValueError(f"size must be >= 1, got {text!r}")
    return value


def d2t_size(head_dir: Path) -> int | None:
    """|D| of an EAGLE-3 head with a pruned vocabulary (its ``d2t`` buffer), else None."""
    # deferred: imports safetensors only when called
    from safetensors import safe_open

    for file in sorted(Path(head_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            if "d2t" in handle.keys():
                return handle.get_slice("d2t").get_shape()[0]
    return None


FIXED_DEPTH = "--no-nanospec-adaptive"


def build_configs(
    drafts: list[Draft],
    modes: list[str],
    static_ks: list[int],
    w_maxes: list[int],
    token_maps: dict[int, Path],
    prior_ks: list[int] = (0,),
    tpe_token_map: Path | None = None,
    adaptive: bool = False,
) -> list[BenchConfig]:
    """``ar`` first, then per draft: each mode; `static` once per k (and once with the
    TPE-trimmed map, if given), `nanospec` once per W_max and prior k (the default W_max
    and k = 0 keep the plain name). With ``adaptive``, each `nanospec` configuration again
    with ``--nanospec-adaptive`` (``...-nanospec-adaptive``), beside the fixed-depth one."""
    configs = [BenchConfig(AR)]
    for draft in drafts:
        spec = speculative_flags(draft.algorithm, draft.path, draft.steps, draft.topk, draft.tokens)
        spec.append(FIXED_DEPTH)  # the launch's depth every step (adaptive: the CPU default)
        for mode in modes:
            if mode == "static" and draft.algorithm == "EAGLE3":
                size = d2t_size(draft.path)
                if size is not None:
                    name = f"{draft.label}-static-{size_label(size)}"
                    flags = (*spec, "--nanospec-mode", "static")
                    configs.append(BenchConfig(name, draft, mode, static_k=size, flags=flags))
                continue
            if mode == "static":
                for k in static_ks:
                    flags = [*spec, "--nanospec-mode", "static"]
                    flags += ["--speculative-token-map", str(token_maps[k])]
                    name = f"{draft.label}-static-{size_label(k)}"
                    configs.append(BenchConfig(name, draft, mode, static_k=k, flags=tuple(flags)))
                if tpe_token_map is not None:
                    flags = [*spec, "--nanospec-mode", "static"]
                    flags += ["--speculative-token-map", str(tpe_token_map)]
                    name = f"{draft.label}-static-tpe"
                    configs.append(BenchConfig(name, draft, mode, flags=tuple(flags)))
                continue
            sweep = mode == "nanospec"
            for w in w_maxes if sweep else [DEFAULT_W_MAX]:
                for k in prior_ks if sweep else [0]:
                    name = f"{draft.label}-{mode}" + (f"-w{w}" if w != DEFAULT_W_MAX else "")
                    name += f"-p{k}" if k else ""
                    flags = [*spec, "--nanospec-mode", mode, "--nanospec-w-max", str(w)]
                    flags += ["--nanospec-prior-k", str(k)] if k else []
                    config = BenchConfig(name, draft, mode, w_max=w, prior_k=k, flags=tuple(flags))
                    configs.append(config)
                    if adaptive and sweep:
                        configs.append(adaptive_twin(config))
    return configs


def adaptive_twin(config: BenchConfig) -> BenchConfig:
    flags = tuple(flag for flag in config.flags if flag != FIXED_DEPTH)
    return BenchConfig(
        f"{config.name}-adaptive", config.draft, config.mode, w_max=config.w_max,
        prior_k=config.prior_k, adaptive=True, flags=(*flags, "--nanospec-adaptive"),
    )  # fmt: skip


def full_vocab_reference(configs: list[BenchConfig], config: BenchConfig) -> str | None:
    """The full-vocabulary configuration of the same draft (ratios are taken to it)."""
    if config.draft is None:
        return None
    for other in configs:
        if other.draft == config.draft and other.mode == "full" and not other.adaptive:
            return other.name
    return None


def default_token_map_corpus() -> list[Path]:
    """Text that is not the benchmark: Python's standard library sources and the tiny
    models' English corpus (both on every install, offline)."""
    # deferred: imports torch only when called
    from nanospec_server.models.tiny.tokenizer import CORPUS_PATH

    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:300]
    return [*stdlib, Path(CORPUS_PATH)]


def build_token_maps(
    tokenizer_dir: Path, ks: list[int], vocab_size: int, out_dir: Path, corpus: list[Path]
) -> dict[int, Path]:
    """One FR-Spec token map per k (k capped at the vocabulary), cached in ``out_dir``."""
    # deferred: imports torch only when called
    from nanospec_server.vocab_tools.token_map import build_token_map

    maps = {}
    for k in ks:
        path = out_dir / f"token_map_{size_label(k)}.pt"
        if not path.is_file():
            build_token_map(tokenizer_dir, corpus, min(k, vocab_size), path)
        maps[k] = path
    return maps


def size_arg(text: str) -> int:
    """A size flag's argparse type: 32k or 512."""
    try:
        return parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 32k or 512, got {text!r}") from None


def default_dtype() -> str:
    """What `nanospec serve` runs real models in here: float32 on a CPU without native bf16
    (``host.cpu_default_dtype``), else the checkpoints' bfloat16."""
    return "bfloat16" if host.has_cuda() else host.cpu_default_dtype() or "bfloat16"
