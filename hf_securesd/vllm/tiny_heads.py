"""Tiny random EAGLE draft heads for a target saved as an HF folder, built from a config (nothing is
downloaded), in the layout vLLM loads: for the plugin's engine tests and the overhead benchmark.

* `build_eagle_head`: vLLM's `EagleLlamaForCausalLM`, one Llama decoder layer without its input norm
  over `fc([token embedding, target hidden state])`; the embedding and lm_head are shared with the target
  (vLLM does that when the checkpoint has none).
* `build_eagle3_head`: vLLM's `Eagle3LlamaForCausalLM`, one decoder layer whose attention reads
  [token embedding, hidden state] (2 * hidden wide) after `fc` over three of the target's hidden states
  (`eagle_aux_hidden_state_layer_ids`), with its own lm_head over the target's vocabulary.

The weights are random (seeded), so the drafts are poor but real: they exercise the drafting path and
the verification of every drafted token. Needs `safetensors` and `transformers` (both come with vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def _head_config(target_dir: Path, architecture: str, **extra: object):
    """A one-layer LlamaConfig with the target's widths, vocabulary and norm epsilon."""
    from transformers import LlamaConfig

    target = json.loads((Path(target_dir) / "config.json").read_text())
    needed = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
              "max_position_embeddings", "rms_norm_eps")
    missing = [key for key in needed if key not in target]
    if missing:
        raise ValueError(
            f"{target_dir}/config.json has no {', '.join(missing)}: tiny EAGLE heads are built for Llama-style "
            "targets (Llama, Qwen2/3, Mistral, Phi-3: RMS norm, grouped-query attention)"
        )
    return LlamaConfig(
        hidden_size=target["hidden_size"], intermediate_size=target["intermediate_size"], num_hidden_layers=1,
        num_attention_heads=target["num_attention_heads"], num_key_value_heads=target["num_key_value_heads"],
        vocab_size=target["vocab_size"], max_position_embeddings=target["max_position_embeddings"],
        rms_norm_eps=target["rms_norm_eps"], tie_word_embeddings=False, architectures=[architecture], **extra,
    )


def _save(config, weights: dict[str, torch.Tensor], out: Path) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, str(out / "model.safetensors"))
    config.save_pretrained(out)
    return out


def build_eagle_head(target_dir: Path, out: Path, seed: int = 0) -> Path:
    """Save a random EAGLE (EAGLE-1) head for the target in `target_dir` (an HF folder) to `out`; returns
    `out`. Weights: `layers.0.*` (no `input_layernorm`) and `fc.weight` [hidden, 2 * hidden]."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = _head_config(target_dir, "EagleLlamaForCausalLM")
    hidden = config.hidden_size
    torch.manual_seed(seed)
    layer = LlamaDecoderLayer(config, 0)
    weights = {
        f"layers.0.{name}": tensor.detach().clone()
        for name, tensor in layer.state_dict().items() if not name.startswith("input_layernorm")
    }
    weights["fc.weight"] = torch.randn(hidden, 2 * hidden) / (2 * hidden) ** 0.5
    return _save(config, weights, out)


def build_eagle3_head(target_dir: Path, out: Path, seed: int = 0) -> Path:
    """Save a random EAGLE-3 head for the target in `target_dir` to `out`; returns `out`. It reads the
    target's hidden states after its embedding, its middle layer and its last layer (layer ids 0,
    L // 2, L for a target of L layers). Weights: `midlayer.*` (q/k/v over 2 * hidden), `fc.weight`
    [hidden, 3 * hidden], `norm.weight` and `lm_head.weight` [V, hidden]."""
    target = json.loads((Path(target_dir) / "config.json").read_text())
    layers = target["num_hidden_layers"]
    aux_layers = [0, layers // 2, layers]
    config = _head_config(
        target_dir, "Eagle3LlamaForCausalLM", draft_vocab_size=target["vocab_size"],
        eagle_config={"eagle_aux_hidden_state_layer_ids": aux_layers, "use_aux_hidden_state": True},
    )
    hidden, vocab = config.hidden_size, config.vocab_size
    head_dim = hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    generator = torch.Generator().manual_seed(seed)

    def linear(rows: int, columns: int) -> torch.Tensor:
        return torch.randn(rows, columns, generator=generator) / columns**0.5

    inter = config.intermediate_size
    weights = {
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.self_attn.q_proj.weight": linear(hidden, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": linear(kv, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": linear(kv, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": linear(hidden, hidden),
        "midlayer.mlp.gate_proj.weight": linear(inter, hidden),
        "midlayer.mlp.up_proj.weight": linear(inter, hidden),
        "midlayer.mlp.down_proj.weight": linear(hidden, inter),
        "fc.weight": linear(hidden, len(aux_layers) * hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": linear(vocab, hidden),
    }
    return _save(config, weights, out)
