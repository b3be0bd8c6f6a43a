"""Caches the loop must roll back draft by draft: sliding-window layers past their window (Gemma 2/3,
Mistral), the batch bound under which masked slots cannot enter a window, and the layers it refuses."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicSlidingWindowLayer, StaticLayer

import hf_securesd
from hf_securesd import SecureSDConfigError
from support import sharp_random_model

VOCAB = 259
PROMPT = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 33]])
WINDOW = 8
# A static cache is refused for its size, or, where transformers gives static layers no crop, for its layers.
STATIC_REFUSAL = r"the target cache is static {}|keeps StaticLayer.* cache layers"

CONFIGS = {
    "mistral": lambda window: transformers.MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=window, vocab_size=VOCAB,
    ),
    "gemma2": lambda window: transformers.Gemma2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=window, final_logit_softcapping=30.0, vocab_size=VOCAB,
    ),
    "gemma3": lambda window: transformers.Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=window, vocab_size=VOCAB,
    ),
}


def _model(family: str, seed: int, window: int = WINDOW):
    config = CONFIGS[family](window)
    config.pad_token_id = 256
    return sharp_random_model(config, seed)


def _pair(family: str, window: int = WINDOW):
    return _model(family, 1, window), hf_securesd.wrap(_model(family, 0, window))


def _counting_forwards(model) -> list[int]:
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_lossless_past_the_sliding_window_equals_target_greedy(family):
    draft, target = _pair(family)
    expected = target.generate(PROMPT, max_new_tokens=40, do_sample=False)
    assert any(isinstance(layer, DynamicSlidingWindowLayer) for layer in transformers.DynamicCache(config=target.config).layers)
    drafted = target.generate(PROMPT, assistant_model=draft, verifier="lossless", max_new_tokens=40, do_sample=False)
    looked_up = target.generate(PROMPT, prompt_lookup_num_tokens=3, verifier="lossless", max_new_tokens=40, do_sample=False)
    assert torch.equal(drafted, expected)
    assert torch.equal(looked_up, expected)


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_relaxed_rule_past_the_window_keeps_the_secure_prefix(family):
    draft, target = _pair(family)
    expected = target.generate(PROMPT, max_new_tokens=40, do_sample=False)
    out = target.generate(PROMPT, assistant_model=draft, verifier="mars", secure_schedule=hf_securesd.Step(L=2),
                          max_new_tokens=40, do_sample=False, return_dict_in_generate=True)
    assert out.sequences.shape[1] == PROMPT.shape[1] + 40
    assert torch.equal(out.sequences[:, : PROMPT.shape[1] + 2], expected[:, : PROMPT.shape[1] + 2])


def test_returned_cache_is_trimmed_and_continues_exactly():
    draft, target = _pair("gemma2")
    first = target.generate(PROMPT, assistant_model=draft, verifier="lossless", max_new_tokens=30, do_sample=False,
                            return_dict_in_generate=True)
    sliding = [layer for layer in first.cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
    assert sliding and all(not layer.record_past for layer in sliding), "handed back as plain decoding leaves it"
    assert all(layer.keys.shape[-2] == WINDOW - 1 for layer in sliding), "trimmed back to the window"
    conversation = torch.cat([first.sequences, torch.tensor([[65, 66]])], dim=1)
    expected = target.generate(conversation, max_new_tokens=12, do_sample=False)
    continued = target.generate(conversation, assistant_model=draft, verifier="lossless", max_new_tokens=12,
                                do_sample=False, past_key_values=first.cache)
    assert torch.equal(continued, expected)


def test_a_batch_that_cannot_reach_the_window_equals_plain_batched_decoding():
    draft, target = _pair("mistral", window=64)
    prompts = torch.tensor([[256, 256, 72, 101, 108], [97, 98, 99, 100, 101]])
    mask = (prompts != 256).long()
    # 5 prompt slots + 2 rows x (20 - 1) new tokens' slots = 43 <= 64
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=20, do_sample=False)
    ours = target.generate(prompts, attention_mask=mask, assistant_model=draft, verifier="lossless",
                           max_new_tokens=20, do_sample=False)
    assert torch.equal(ours, expected)


def test_a_batch_that_could_reach_the_window_is_refused_before_any_forward():
    draft, target = _pair("gemma2")
    calls = _counting_forwards(target)
    prompts = torch.tensor([[72, 101, 108], [97, 98, 99]])
    with pytest.raises(SecureSDConfigError, match=r"sliding-window \(or chunked\) attention \(window 8\).*could fill 41 .*one row per generate call"):
        target.generate(prompts, assistant_model=draft, verifier="lossless", max_new_tokens=20, do_sample=False)
    assert calls == []


def test_holes_inside_a_window_would_change_the_tokens():
    """Why the batch bound exists: with it lifted, masked slots enter the window and rows drift from plain
    batched decoding (so the refusal above guards a real difference, not a theoretical one)."""
    from hf_securesd import cache_support

    draft, target = _pair("gemma2")
    prompts = torch.tensor([[72, 101, 108], [97, 98, 99]])
    expected = target.generate(prompts, max_new_tokens=30, do_sample=False)
    original = cache_support.smallest_window
    try:
        cache_support.smallest_window = lambda layers: None
        unguarded = target.generate(prompts, assistant_model=draft, verifier="lossless", max_new_tokens=30, do_sample=False)
    finally:
        cache_support.smallest_window = original
    assert not torch.equal(unguarded, expected)


def test_a_static_sliding_window_that_could_be_passed_is_refused():
    draft, target = _pair("gemma2")
    with pytest.raises(SecureSDConfigError, match=STATIC_REFUSAL.format(r"and holds 8 slots per layer, but this call could fill 27 .*cannot bring back")):
        target.generate(PROMPT, assistant_model=draft, verifier="lossless", max_new_tokens=20, do_sample=False,
                        cache_implementation="static")


def test_a_static_cache_is_refused_for_a_batch_whose_holes_could_overflow_it(llama_pair):
    draft, target = llama_pair
    prompts = torch.tensor([[256, 256, 72, 101], [97, 98, 99, 100]])
    with pytest.raises(SecureSDConfigError, match=STATIC_REFUSAL.format("")):
        target.generate(prompts, attention_mask=(prompts != 256).long(), assistant_model=draft, verifier="lossless",
                        max_new_tokens=30, do_sample=False, cache_implementation="static")


def test_a_static_cache_is_continued_where_transformers_can_crop_it(llama_pair):
    draft, target = llama_pair
    prompt = torch.tensor([[12, 40, 7, 99, 3, 18]])
    expected = target.generate(prompt, max_new_tokens=16, do_sample=False)
    if callable(getattr(StaticLayer, "crop", None)):
        ours = target.generate(prompt, assistant_model=draft, verifier="lossless", max_new_tokens=16, do_sample=False,
                               cache_implementation="static")
        assert torch.equal(ours, expected)
    else:
        with pytest.raises(SecureSDConfigError, match="StaticLayer cache layers"):
            target.generate(prompt, assistant_model=draft, verifier="lossless", max_new_tokens=16, do_sample=False,
                            cache_implementation="static")


def test_a_model_with_recurrent_state_layers_is_refused_with_its_layer_named():
    torch.manual_seed(0)
    config = transformers.RecurrentGemmaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, lru_width=64,
        attention_window_size=8, vocab_size=VOCAB, pad_token_id=256,
    )
    target = hf_securesd.wrap(AutoModelForCausalLM.from_config(config).eval())
    draft = AutoModelForCausalLM.from_config(config).eval()
    # Ours names the layers; where this transformers release builds attention layers for the model, its own
    # refusal of stateful models comes first.
    refusal = r"the (target|draft) model \(RecurrentGemmaForCausalLM\) keeps .*cannot be rolled back|not supported with stateful models"
    for kwargs in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
        with pytest.raises(ValueError, match=refusal):
            target.generate(PROMPT, verifier="lossless", max_new_tokens=4, do_sample=False, **kwargs)


def test_quantized_cache_layers_are_refused(llama_pair):
    from transformers.cache_utils import QuantizedLayer

    from hf_securesd.cache_support import check_cache_layers

    class Layer(QuantizedLayer):  # the layer type is what is checked, not its quantizer
        _quantize = _dequantize = None

    class Quantized(transformers.DynamicCache):
        def __init__(self):
            super().__init__()
            self.layers = [object.__new__(Layer)]

    draft, target = llama_pair
    with pytest.raises(SecureSDConfigError, match="keeps Layer cache layers, which cannot be rolled back"):
        check_cache_layers("target", target, Quantized())


def test_a_static_cache_too_small_for_the_call_is_refused_with_the_reason(llama_pair):
    """Plain `generate` fails on such a cache with an IndexError from inside the attention; here it is named."""
    draft, target = llama_pair
    if not callable(getattr(StaticLayer, "crop", None)):
        pytest.skip("this transformers release gives static layers no crop (refused for that, tested above)")
    prompt = torch.tensor([[12, 40, 7, 99, 3, 18]])
    cache = transformers.StaticCache(config=target.config, max_cache_len=14)  # sized for the first call
    first = target.generate(prompt, max_new_tokens=8, do_sample=False, cache=cache, return_dict_in_generate=True)
    conversation = torch.cat([first.sequences, torch.tensor([[5, 6]])], dim=1)
    with pytest.raises(SecureSDConfigError, match="holds 14 slots per layer, but this call could fill 23 .*has no room"):
        target.generate(conversation, assistant_model=draft, verifier="lossless", max_new_tokens=8, do_sample=False,
                        cache=cache)


def test_a_static_cache_from_a_previous_call_is_continued_exactly(llama_pair):
    """A static cache reports its length as its own counter tensor: the loop must count slots in a copy."""
    draft, target = llama_pair
    if not callable(getattr(StaticLayer, "crop", None)):
        pytest.skip("this transformers release gives static layers no crop (refused for that, tested above)")
    prompt = torch.tensor([[12, 40, 7, 99, 3, 18]])
    cache = transformers.StaticCache(config=target.config, max_cache_len=48)
    first = target.generate(prompt, max_new_tokens=8, do_sample=False, cache=cache, return_dict_in_generate=True)
    conversation = torch.cat([first.sequences, torch.tensor([[5, 6]])], dim=1)
    expected = target.generate(conversation, max_new_tokens=12, do_sample=False, cache=copy.deepcopy(cache))
    ours = target.generate(conversation, assistant_model=draft, verifier="lossless", max_new_tokens=12, do_sample=False,
                           cache=cache)
    assert torch.equal(ours, expected)


def test_a_draft_with_a_window_bounds_the_batch_too(llama_pair):
    _, target = llama_pair  # full attention
    draft = _model("mistral", 1)
    prompts = torch.tensor([[72, 101, 108], [97, 98, 99]])
    with pytest.raises(SecureSDConfigError, match=r"the draft model \(MistralForCausalLM\) has sliding-window"):
        target.generate(prompts, assistant_model=draft, verifier="lossless", max_new_tokens=20, do_sample=False)
    expected = target.generate(prompts[:1], max_new_tokens=20, do_sample=False)
    ours = target.generate(prompts[:1], assistant_model=draft, verifier="lossless", max_new_tokens=20, do_sample=False)
    assert torch.equal(ours, expected)


def test_a_cache_filled_for_another_number_of_rows_is_refused_before_any_forward(llama_pair):
    """A batch-1 cache with a batch-2 prompt: a clear error, not transformers' size mismatch mid-round."""
    draft, target = llama_pair
    out = target.generate(torch.tensor([[1, 2]]), max_new_tokens=1, return_dict_in_generate=True)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    calls = {"n": 0}
    handles = [model.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1)) for model in (draft, target)]
    try:
        with pytest.raises(SecureSDConfigError, match="the target cache passed to generate holds 1 row but input_ids "
                           "has 2: .* pass the cache returned for these same rows"):
            target.generate(torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]]), past_key_values=cache, max_new_tokens=3,
                            assistant_model=draft, verifier="lossless")
    finally:
        for handle in handles:
            handle.remove()
    assert calls["n"] == 0


def _left_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of 5, 9 and 3 tokens, left-padded with 256: rows that reach their budgets in different
    rounds and leave the batch one by one."""
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 250, (n,), generator=generator) for n in (5, 9, 3)]
    ids, mask = torch.full((3, 9), 256), torch.zeros(3, 9, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, 9 - len(row):], mask[index, 9 - len(row):] = row, 1
    return ids, mask


def test_a_static_cache_large_enough_for_a_batch_drops_finished_rows_exactly(llama_pair):
    """Rows finish in different rounds and leave the batch: static layers had no row selection (an
    AttributeError mid-decoding); the loop now selects their rows as it does a dynamic layer's."""
    draft, target = llama_pair
    if not callable(getattr(StaticLayer, "crop", None)):
        pytest.skip("this transformers release gives static layers no crop (refused for that, tested above)")
    ids, mask = _left_padded_batch()
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    for cache_arguments in ({"cache": transformers.StaticCache(config=target.config, max_cache_len=100)},
                            {"cache_implementation": "static", "max_cache_len": 100}):
        ours = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                               assistant_model=draft, verifier="lossless", **cache_arguments)
        assert torch.equal(ours, expected)


def test_a_batch_is_refused_where_a_cache_layer_cannot_drop_rows(llama_pair):
    draft, target = llama_pair

    class OwnStaticLayer(StaticLayer):
        """A static layer of another type: transformers gives it no `batch_select_indices`."""

    layers = [OwnStaticLayer(max_cache_len=100) for _ in range(target.config.num_hidden_layers)]
    cache = transformers.cache_utils.Cache(layers=layers)
    if not callable(getattr(StaticLayer, "crop", None)):
        pytest.skip("this transformers release gives static layers no crop (refused for that, tested above)")
    ids, mask = _left_padded_batch()
    with pytest.raises(SecureSDConfigError, match="the target cache keeps OwnStaticLayer layers, which cannot drop the "
                       "rows of a batch that finish before the others.*Pass one row per generate call"):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, assistant_model=draft,
                        verifier="lossless", cache=cache)
    expected = target.generate(input_ids=ids[:1], max_new_tokens=8, do_sample=False)
    one_row = transformers.cache_utils.Cache(layers=[OwnStaticLayer(max_cache_len=100) for _ in layers])
    ours = target.generate(input_ids=ids[:1], max_new_tokens=8, do_sample=False, assistant_model=draft,
                           verifier="lossless", cache=one_row)
    assert torch.equal(ours, expected)


def _gpt_neo(noise: float = 0.0, layers: tuple[str, ...] = ("global", "local"), positions: int = 256):
    """GPT-Neo with one global and one "local" layer: the local window is applied in the attention mask
    over cache slots, while its cache keeps every slot (plain DynamicLayers). noise > 0: a draft, the same
    weights perturbed, which agrees with the target on some tokens only (rows keep different numbers of
    drafts)."""
    config = transformers.GPTNeoConfig(hidden_size=64, num_layers=2, num_heads=4, attention_types=[[list(layers), 2 // len(layers)]],
                                       window_size=WINDOW, vocab_size=VOCAB, max_position_embeddings=positions,
                                       bos_token_id=256, eos_token_id=None, pad_token_id=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3.0)
            if noise and parameter.ndim > 1:
                parameter.add_(noise * torch.randn(parameter.shape, generator=generator) * parameter.std())
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 256
    return model


def test_gpt_neo_local_attention_bounds_a_batch_as_a_sliding_window_does():
    """GPT-Neo's local layers went unnoticed (no sliding-window cache layer): a left-padded batch decoded
    other tokens than its rows one at a time. It is refused past the window, admitted within it, and the
    refusal guards a real difference (lifted, rows drift)."""
    from hf_securesd import cache_support

    draft, target = _gpt_neo(noise=0.05), hf_securesd.wrap(_gpt_neo())
    assert not any(isinstance(layer, DynamicSlidingWindowLayer) for layer in transformers.DynamicCache(config=target.config).layers)
    rows = [[72, 101, 108, 108, 111, 32, 119, 33], [97, 98, 99, 100, 101], [10, 20, 30]]
    prompts = torch.tensor([[256] * (8 - len(row)) + row for row in rows])
    mask = (prompts != 256).long()
    lossless = dict(attention_mask=mask, assistant_model=draft, verifier="lossless", do_sample=False)
    with pytest.raises(SecureSDConfigError, match=r"attention \(window 8\).*could fill 41 .*one row per generate call"):
        target.generate(prompts, max_new_tokens=12, **lossless)
    short = torch.tensor([[256, 72], [97, 98]])
    within = target.generate(short, attention_mask=(short != 256).long(), assistant_model=draft, verifier="lossless",
                             max_new_tokens=4, do_sample=False)
    assert torch.equal(within, target.generate(short, attention_mask=(short != 256).long(), max_new_tokens=4, do_sample=False))
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=12, do_sample=False)
    original = cache_support.mask_window
    try:
        cache_support.mask_window = lambda config: None
        unguarded = target.generate(prompts, max_new_tokens=12, **lossless)
    finally:
        cache_support.mask_window = original
    assert not torch.equal(unguarded, expected)


def test_gpt_neo_bounds_a_batch_by_its_causal_mask_table():
    """GPT-Neo reads its causal mask from a [max_position_embeddings]^2 table at the key's cache slot: with
    global layers only, a padded batch's masked slots pushed the cache past the table (RuntimeError inside its
    attention, with a draft model and with prompt lookup). Refused before decoding past the table; within
    it, equal to plain batched greedy."""
    target, draft = hf_securesd.wrap(_gpt_neo(layers=("global",), positions=32)), _gpt_neo(0.05, ("global",), 32)
    prompts = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 33], [256, 256, 256, 97, 98, 99, 100, 101]])
    mask = (prompts != 256).long()
    for proposer in (dict(assistant_model=draft), dict(prompt_lookup_num_tokens=3)):
        with pytest.raises(SecureSDConfigError, match=r"reads its attention mask from a table of 32 cache slots "
                           r"\(max_position_embeddings\), and a batch of 2 rows could fill 56.*\(here 8 \+ 2 x \(25 - 1\)\)"):
            target.generate(prompts, attention_mask=mask, verifier="lossless", max_new_tokens=25, do_sample=False,
                            **proposer)
        within = target.generate(prompts, attention_mask=mask, verifier="lossless", max_new_tokens=12, do_sample=False,
                                 **proposer)
        assert torch.equal(within, target.generate(prompts, attention_mask=mask, max_new_tokens=12, do_sample=False))
    single = target.generate(prompts[:1], verifier="lossless", max_new_tokens=25, do_sample=False, assistant_model=draft)
    assert torch.equal(single, target.generate(prompts[:1], max_new_tokens=25, do_sample=False))  # batch 1: no holes
