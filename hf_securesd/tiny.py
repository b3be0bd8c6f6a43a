"""Tiny, randomly initialised draft/target pairs built from configs, for tests, examples and the
`smoke` benchmark profile. Nothing here touches the network.

The pair shares a byte-level tokenizer (256 byte tokens plus three chat specials) with a Qwen-style
chat template, so every code path that needs text (chat templates, decoding, scorers) runs end to end.
The draft is the target with perturbed weights (by default the same depth), so the two agree on
about half of the greedy tokens: acceptance rates are informative without being trivial.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)
from tokenizers.pre_tokenizers import ByteLevel

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_of(symbol: str) -> int:
    """The byte that GPT-2's byte-level alphabet maps to `symbol` (so token id == byte value)."""
    code = ord(symbol)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges: every byte is one token (ids 0-255), then the
    specials `<|endoftext|>` (256, bos/pad), `<|im_start|>` (257) and `<|im_end|>` (258, eos)."""
    vocab = {symbol: index for index, symbol in enumerate(sorted(ByteLevel.alphabet(), key=_byte_of))}
    for special in SPECIAL_TOKENS:
        vocab[special] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclass(frozen=True)
class TinyPairSpec:
    """Shape of a tiny pair. `architecture` is "llama" or "qwen2"."""

    architecture: str = "llama"
    vocab_size: int = 259
    hidden_size: int = 64
    target_layers: int = 2
    draft_layers: int = 2
    heads: int = 4
    initializer_range: float = 0.3
    draft_noise: float = 0.05
    seed: int = 0


def _config(spec: TinyPairSpec, num_layers: int, eos_token_id: int):
    common = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads // 2,
        max_position_embeddings=1024,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=False,
        bos_token_id=min(256, spec.vocab_size - 1),
        pad_token_id=min(256, spec.vocab_size - 1),
        eos_token_id=eos_token_id,
    )
    if spec.architecture == "llama":
        return LlamaConfig(**common)
    if spec.architecture == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"unknown tiny architecture {spec.architecture!r}; use 'llama' or 'qwen2'")


def tiny_pair(spec: TinyPairSpec = TinyPairSpec()) -> tuple[PreTrainedModel, PreTrainedModel]:
    """Build `(draft, target)` in fp32 eval mode. The draft copies the target's embeddings, first
    `draft_layers` layers and head, each weight perturbed by `draft_noise` times its own std."""
    eos = min(258, spec.vocab_size - 1)
    torch.manual_seed(spec.seed)
    target = AutoModelForCausalLM.from_config(_config(spec, spec.target_layers, eos), dtype=torch.float32)
    draft = AutoModelForCausalLM.from_config(_config(spec, spec.draft_layers, eos), dtype=torch.float32)
    generator = torch.Generator().manual_seed(spec.seed + 1)
    target_state = target.state_dict()
    with torch.no_grad():
        for name, weight in draft.state_dict().items():
            source = target_state[name]
            noise = torch.randn(source.shape, generator=generator) * source.float().std().clamp_min(1e-3)
            weight.copy_(source + spec.draft_noise * noise if source.ndim > 1 else source)
    for model in (draft, target):
        model.eval()
        model.generation_config.pad_token_id = spec.vocab_size - 1 if spec.vocab_size <= 256 else 256
        model.generation_config.eos_token_id = eos
        model.generation_config.bos_token_id = model.generation_config.pad_token_id
    return draft, target
