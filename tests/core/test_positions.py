"""A model with a table of absolute positions (learned: GPT-2, OPT; a precomputed rotary sin/cos buffer:
GPT-J, CodeGen) embeds only that many positions: a call that could feed either model more is refused before
decoding, naming the model and the limit (it was an IndexError from inside torch's lookup, for a draft
shorter than its target mid-decoding), and a batch's rows near their budget read the table's last row."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_securesd
from hf_securesd import SecureSDConfigError
from hf_securesd.positions import position_limit

PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])


def _gpt2(positions: int, seed: int = 3) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=259, n_embd=64, n_layer=2, n_head=4, n_positions=positions,
                                     bos_token_id=256, eos_token_id=258)
    return transformers.GPT2LMHeadModel(config).eval()


def _opt(positions: int) -> transformers.PreTrainedModel:
    torch.manual_seed(4)
    config = transformers.OPTConfig(vocab_size=259, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                    num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=positions,
                                    bos_token_id=256, eos_token_id=258, pad_token_id=1)
    return transformers.OPTForCausalLM(config).eval()


def _rotary_table(config_class: type, positions: int, seed: int = 5) -> transformers.PreTrainedModel:
    """GPT-J or CodeGen: rotary positions read from a [positions, dim] sin/cos buffer (`embed_positions`)."""
    torch.manual_seed(seed)
    config = config_class(vocab_size=259, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=positions,
                          bos_token_id=256, eos_token_id=258)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _gptj(positions: int, seed: int = 5) -> transformers.PreTrainedModel:
    return _rotary_table(transformers.GPTJConfig, positions, seed)


def _codegen(positions: int, seed: int = 5) -> transformers.PreTrainedModel:
    return _rotary_table(transformers.CodeGenConfig, positions, seed)


def test_the_limit_is_read_from_a_table_of_positions_only(llama_pair) -> None:
    _, target = llama_pair
    assert position_limit(_gpt2(16)) == 16
    assert position_limit(_opt(16)) == 16  # 18 rows, the first 2 skipped (OPT's offset)
    assert position_limit(_gptj(16)) == position_limit(_codegen(16)) == 16  # the sin/cos buffer's rows
    assert position_limit(target) is None  # rotary positions computed per call: no table


@pytest.mark.parametrize("build", [_gpt2, _opt, _gptj, _codegen])
def test_a_draft_with_a_short_table_runs_up_to_it_and_is_refused_beyond(llama_pair, build) -> None:
    _, target = llama_pair
    draft = build(16)
    expected = target.generate(PROMPT, max_new_tokens=10, do_sample=False)
    ours = target.generate(PROMPT, max_new_tokens=10, do_sample=False, assistant_model=draft, verifier="lossless")
    assert torch.equal(ours, expected)  # 7 + 10 - 1 = 16 positions: the whole table
    for verifier in ("lossless", "mars"):
        with pytest.raises(SecureSDConfigError, match=rf"the draft model \({type(draft).__name__}\) embeds at most 16 "
                           r"positions .* can feed it up to 17 .*lower max_new_tokens to 10 or less"):
            target.generate(PROMPT, max_new_tokens=11, do_sample=False, assistant_model=draft, verifier=verifier)
    with pytest.raises(SecureSDConfigError, match="the longest prompt alone has 17 tokens; shorten the prompt to 16"):
        target.generate(torch.arange(17)[None], max_new_tokens=2, assistant_model=draft, verifier="lossless")


def test_left_padding_does_not_count_and_the_target_is_checked_too(llama_pair) -> None:
    draft, _ = llama_pair
    target = hf_securesd.wrap(_gpt2(16))
    padded = torch.cat([torch.full((1, 2), 256), PROMPT], dim=1)  # 9 ids, 7 of them unmasked
    mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], dim=1)
    expected = target.generate(padded, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=256)
    ours = target.generate(padded, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=256,
                           assistant_model=draft, verifier="lossless")
    assert torch.equal(ours, expected)
    with pytest.raises(SecureSDConfigError, match=r"the target model \(GPT2LMHeadModel\) embeds at most 16 positions"):
        target.generate(padded, attention_mask=mask, max_new_tokens=11, pad_token_id=256, assistant_model=draft,
                        verifier="lossless")


def test_a_batch_feeds_rows_near_their_budget_past_the_table_without_failing(llama_pair) -> None:
    """Every row of a batch is fed the batch's k drafts, so a row near its budget reaches positions past
    what it keeps (and past a table that holds exactly prompt + max_new_tokens - 1): those slots are
    never kept, so the table is read at its last row there (it was torch's IndexError)."""
    draft = _gpt2(16, seed=2)
    target = hf_securesd.wrap(_gpt2(64, seed=1))
    prompts = torch.randint(0, 250, (4, 7), generator=torch.Generator().manual_seed(0))
    expected = torch.cat([target.generate(row[None], max_new_tokens=10, do_sample=False) for row in prompts])
    ours = target.generate(prompts, max_new_tokens=10, do_sample=False, assistant_model=draft, verifier="lossless")
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("build", [_gptj, _codegen])
def test_a_left_padded_batch_of_a_rotary_table_draft_reads_its_last_row_past_a_rows_budget(build) -> None:
    """A GPT-J/CodeGen draft in a padded batch whose longest row ends at its table's last position: a row
    near its budget was fed positions past the sin/cos table (IndexError mid-decoding)."""
    target = hf_securesd.wrap(build(32, seed=1))
    draft = build(32, seed=2)
    prompts = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 33], [256, 256, 256, 97, 98, 99, 100, 101],
                            [256, 256, 256, 256, 256, 10, 20, 30]])
    mask = (prompts != 256).long()
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=25, do_sample=False, pad_token_id=256)
    ours = target.generate(prompts, attention_mask=mask, max_new_tokens=25, do_sample=False, pad_token_id=256,
                           assistant_model=draft, verifier="lossless")
    assert torch.equal(ours, expected)
