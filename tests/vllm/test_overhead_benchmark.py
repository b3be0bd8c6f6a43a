"""The figures of `benchmarks/vllm_overhead.py`: the pooled CPU-time ratio to vLLM, the plugin's added
sampling-stage share and their paired percentile bootstrap intervals over passes, against hand
computations, and the clock of the sampling stage. The script is loaded from its file; these tests need
neither vLLM nor a model."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_overhead.py"


@pytest.fixture(scope="module")
def overhead():
    spec = importlib.util.spec_from_file_location("vllm_overhead_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def row(tokens: list[int], seconds: list[float], thread: list[float] | None = None) -> dict:
    """A configuration's per-pass figures; the engine thread's CPU defaults to half the process's (the
    spinning OpenMP worker holds the other half)."""
    thread = [value / 2 for value in seconds] if thread is None else thread
    return {"generated_tokens": tokens, "cpu_seconds": seconds, "engine_thread_cpu_seconds": thread}


def test_the_pooled_ratio_is_total_tokens_over_total_cpu_time_against_the_baseline(overhead) -> None:
    mine, base = row([100, 300], [1.0, 2.0]), row([200, 200], [1.0, 4.0])
    # (400 / 3) / (400 / 5) = 5 / 3, not the mean of the per-pass ratios (0.5 and 3.0)
    assert overhead.pooled_ratio(mine, base, [0, 1]) == pytest.approx(5 / 3)
    # a pass drawn twice counts twice: (500 / 4) / (600 / 9)
    assert overhead.pooled_ratio(mine, base, [1, 1, 0]) == pytest.approx((700 / 5) / (600 / 9))
    assert overhead.pooled_ratio(mine, base, [0, 0]) == pytest.approx(0.5)


def test_the_percentile_interval_interpolates_between_order_statistics(overhead) -> None:
    # Every resample of two passes, each of the four index sets once: pooled ratios by hand
    mine, base = row([100, 300], [1.0, 2.0]), row([200, 200], [1.0, 4.0])
    ratios = [overhead.pooled_ratio(mine, base, list(s)) for s in itertools.product(range(2), repeat=2)]
    by_hand = sorted([0.5, 5 / 3, 5 / 3, 150 / 50])  # [0,0], [0,1], [1,0], [1,1]
    assert sorted(ratios) == pytest.approx(by_hand)
    low, high = overhead.percentile_interval(ratios)
    # the 2.5 % and 97.5 % quantiles of 4 values sit at positions 0.075 and 2.925 of 0..3
    assert low == pytest.approx(0.5 + 0.075 * (5 / 3 - 0.5))
    assert high == pytest.approx(5 / 3 + 0.925 * (3.0 - 5 / 3))


def test_the_bootstrap_resamples_pass_indices_paired_and_is_seeded(overhead) -> None:
    # The configuration runs exactly 2 % slower than vLLM in every pass while the passes themselves vary
    # three-fold: pairing by pass index leaves no spread at all.
    base = row([640] * 6, [1.0, 3.0, 1.5, 2.0, 1.2, 2.5])
    mine = row([640] * 6, [seconds / 0.98 for seconds in base["cpu_seconds"]])
    figure = overhead.pooled_ratio_interval(mine, base, resamples=500)
    assert figure["ratio"] == pytest.approx(0.98)
    assert figure["low"] == pytest.approx(0.98) and figure["high"] == pytest.approx(0.98)
    assert (figure["level"], figure["resamples"]) == (0.95, 500)
    # Unpaired noise does spread it; the same seed gives the same interval, and it holds the figure
    noisy = row([640] * 6, [1.1, 2.7, 1.6, 2.3, 1.1, 2.4])
    first = overhead.pooled_ratio_interval(noisy, base, resamples=500)
    assert first == overhead.pooled_ratio_interval(noisy, base, resamples=500)
    assert first["low"] < first["ratio"] < first["high"]
    assert first["low"] < first["high"]


def test_every_configuration_gets_its_pooled_figures_and_the_table_prints_them(overhead, capsys) -> None:
    rows = {
        overhead.BASELINE: {**row([64, 64], [1.0, 2.0]), "tokens_per_cpu_s": [64.0, 32.0],
                            "tokens_per_s": [60.0, 30.0], "cpu_ratio_to_vllm": [1.0, 1.0],
                            "stage_cpu_seconds": [0.1, 0.1], "acceptance_rate": 0.5, "engine_torch_threads": 1},
        "plugin_lossless": {**row([64, 64], [1.0, 4.0]), "tokens_per_cpu_s": [64.0, 16.0],
                            "tokens_per_s": [60.0, 15.0], "cpu_ratio_to_vllm": [1.0, 0.5],
                            "stage_cpu_seconds": [0.13, 0.13], "acceptance_rate": 0.5, "engine_torch_threads": 1},
    }
    rows["plugin_lossless"]["engine_thread_cpu_seconds"] = [0.6, 1.2]  # the process's other threads differ
    overhead.add_pooled_ratios(rows, resamples=50)
    assert rows[overhead.BASELINE]["pooled_cpu_ratio_to_vllm"]["ratio"] == pytest.approx(1.0)
    assert rows["plugin_lossless"]["pooled_cpu_ratio_to_vllm"]["ratio"] == pytest.approx(3 / 5)
    # engine thread: (128 / 1.8) / (128 / 1.5)
    assert rows["plugin_lossless"]["pooled_thread_ratio_to_vllm"]["ratio"] == pytest.approx(1.5 / 1.8)
    assert rows[overhead.BASELINE]["added_stage_share"]["value"] == pytest.approx(0.0)
    # (0.26 - 0.2) / 128 tokens of stage time against vLLM's 1.5 engine-thread seconds / 128 tokens
    assert rows["plugin_lossless"]["added_stage_share"]["value"] == pytest.approx(0.04)
    overhead.print_table("ngram", rows)
    printed = capsys.readouterr().out
    assert "pooled vs vLLM [95% CI]" in printed and "   0.600 [" in printed
    assert "engine thread [95% CI]" in printed and "  0.833 [" in printed
    assert "ngram (torch threads in the engine: 1; vLLM's run: process CPU = 2.00 x the engine thread's)" in printed
    assert "added share [95% CI]" in printed and "+0.0400 [" in printed
    assert "      2031.2 " in printed  # the configuration's stage: 0.26 s / 128 tokens in microseconds


def test_the_added_stage_share_compares_stage_time_per_token_against_the_engine_thread(overhead) -> None:
    # the process's CPU (a spinning OpenMP worker besides the engine thread) does not enter
    base = {**row([100, 300], [9.0, 9.0], thread=[1.0, 3.0]), "stage_cpu_seconds": [0.1, 0.3]}
    mine = {**row([200, 200], [9.0, 9.0], thread=[2.0, 2.0]), "stage_cpu_seconds": [0.4, 0.2]}
    # passes 0 and 1: (0.6 / 400 - 0.4 / 400) / (4.0 / 400) = 0.05
    assert overhead.added_stage_share(mine, base, [0, 1]) == pytest.approx(0.05)
    # pass 0 alone: (0.4 / 200 - 0.1 / 100) / (1.0 / 100) = 0.1; pass 1 twice: (0.2 / 200 - 0.3 / 300) / 0.01 = 0
    assert overhead.added_stage_share(mine, base, [0]) == pytest.approx(0.1)
    assert overhead.added_stage_share(mine, base, [1, 1]) == pytest.approx(0.0)
    # a cheaper stage is a negative share; the engine-thread times of the configuration do not enter
    cheaper = {**row([100, 300], [9.0, 9.0], thread=[7.0, 7.0]), "stage_cpu_seconds": [0.05, 0.15]}
    assert overhead.added_stage_share(cheaper, base, [0, 1]) == pytest.approx(-0.2 / 4.0)


def test_the_engine_thread_ratio_pools_the_engine_threads_cpu_time(overhead) -> None:
    base = row([100, 300], [9.0, 9.0], thread=[1.0, 3.0])
    mine = row([100, 300], [1.0, 1.0], thread=[2.0, 3.0])
    # (400 / 5) / (400 / 4): the process's seconds would give 9x instead
    assert overhead.pooled_thread_ratio(mine, base, [0, 1]) == pytest.approx(0.8)
    assert overhead.pooled_thread_ratio(mine, base, [0]) == pytest.approx(0.5)


def test_the_stage_clock_counts_cpu_time_inside_the_installed_methods_once_and_puts_them_back(overhead) -> None:
    import time

    def spin(seconds: float) -> None:
        start = time.thread_time()
        while time.thread_time() - start < seconds:
            pass

    class Runner:
        def _sample(self, outer: bool) -> str:
            spin(0.02)
            if outer:
                self.propose_draft_token_ids()  # nested: counted once, inside the outer call
            return "sampled"

        def propose_draft_token_ids(self) -> str:
            spin(0.03)
            return "proposed"

    installed = {name: Runner.__dict__[name] for name in overhead.STAGE_METHODS}
    runner = Runner()
    with overhead.stage_clock(Runner) as spent:
        spin(0.03)  # outside the methods: not counted
        assert runner._sample(outer=True) == "sampled"
        assert runner.propose_draft_token_ids() == "proposed"
    # the outer call 0.02 + 0.03, the second call 0.03 (counting the nested call again would add 0.03)
    assert 0.08 <= spent[0] < 0.095
    assert {name: Runner.__dict__[name] for name in overhead.STAGE_METHODS} == installed
    with pytest.raises(TypeError):
        with overhead.stage_clock(Runner):
            runner._sample()  # a call that fails leaves the clock by its exception: the methods go back
    assert {name: Runner.__dict__[name] for name in overhead.STAGE_METHODS} == installed


def test_the_tiny_pair_takes_a_tokenizers_vocabulary(overhead, tmp_path) -> None:
    """`--tokenizer DIR`: the pair is built at the vocabulary size of DIR's config.json and saved with
    DIR's tokenizer, so the sampler runs at a real model's vocabulary."""
    import json

    from transformers import AutoConfig, AutoTokenizer

    from hf_securesd.tiny import byte_tokenizer

    source = tmp_path / "tokenizer"
    byte_tokenizer().save_pretrained(source)
    (source / "config.json").write_text(json.dumps({"vocab_size": 1024}))
    target, draft = overhead.build_tiny_pair(tmp_path / "pair", str(source))
    for folder in (target, draft):
        assert AutoConfig.from_pretrained(folder).vocab_size == 1024
        assert len(AutoTokenizer.from_pretrained(folder)) == len(byte_tokenizer())
    (source / "config.json").unlink()  # without a config, the tokenizer's own length
    target, _ = overhead.build_tiny_pair(tmp_path / "pair_from_length", str(source))
    assert AutoConfig.from_pretrained(target).vocab_size == len(byte_tokenizer())
