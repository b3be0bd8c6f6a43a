"""`patch()` / `unpatch()` nest, and leave other libraries' wrappers of `generate` in place."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import GenerationMixin, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

import hf_securesd
from hf_securesd.tiny import TinyPairSpec, tiny_pair

PROMPT = torch.tensor([[7, 8, 9, 10, 11]])
SPEC = TinyPairSpec(architecture="llama", seed=4)


def _speculative(model, draft) -> torch.Tensor:
    return model.generate(PROMPT, max_new_tokens=8, do_sample=False, assistant_model=draft, verifier="lossless")


def _refused_unpatched(model, draft) -> None:
    with pytest.raises(ValueError, match="are not used by the model"):
        _speculative(model, draft)


@pytest.fixture
def pair():
    draft, target = tiny_pair(SPEC)
    yield draft, target
    patching = hf_securesd.integration._patching
    while patching.count:  # a failed test must not leave the process patched
        hf_securesd.unpatch()
    for (owner, name), method in hf_securesd.integration._TRANSFORMERS_METHODS.items():
        setattr(owner, name, method)  # nor ours left under a wrapper the test installed
    patching.saved.clear()


def test_an_inner_patch_and_unpatch_keep_the_outer_patch(pair):
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    hf_securesd.patch()
    hf_securesd.patch()  # a library patching around its own work
    hf_securesd.unpatch()
    assert torch.equal(_speculative(target, draft), greedy)  # still patched
    hf_securesd.unpatch()
    _refused_unpatched(target, draft)
    assert "verifier" not in vars(type(target.generation_config))


def test_unpatch_without_patch_changes_nothing(pair):
    draft, target = pair
    before = (GenerationMixin.generate, GenerationMixin._assisted_decoding, PreTrainedModel.save_pretrained)
    hf_securesd.unpatch()
    assert (GenerationMixin.generate, GenerationMixin._assisted_decoding, PreTrainedModel.save_pretrained) == before
    _refused_unpatched(target, draft)


def _counting(calls: list, method):
    """A wrapper another library might install: counts its calls, then calls `method`."""

    @functools.wraps(method)
    def counting(self, *args, **kwargs):
        calls.append(1)
        return method(self, *args, **kwargs)

    return counting


@pytest.mark.parametrize("cycles_before", [0, 1])
def test_a_wrapper_installed_before_patch_is_called_and_put_back(pair, monkeypatch, cycles_before):
    """Also when the process was patched and unpatched before the wrapper came."""
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    for _ in range(cycles_before):
        hf_securesd.patch()
        hf_securesd.unpatch()
    calls: list = []
    wrapper = _counting(calls, GenerationMixin.generate)
    monkeypatch.setattr(GenerationMixin, "generate", wrapper)
    hf_securesd.patch()
    assert torch.equal(_speculative(target, draft), greedy)
    assert calls == [1]  # the wrapper found at patch() still runs under it
    hf_securesd.unpatch()
    assert GenerationMixin.generate is wrapper


def test_a_wrapper_installed_over_the_patch_survives_unpatch_and_a_later_patch(pair, monkeypatch):
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    hf_securesd.patch()
    calls: list = []
    outer = _counting(calls, GenerationMixin.generate)  # captures ours
    monkeypatch.setattr(GenerationMixin, "generate", outer)
    hf_securesd.unpatch()
    assert GenerationMixin.generate is outer  # someone else's wrapper is not dropped
    _refused_unpatched(target, draft)  # ... and SecureSD, reached through it, is off
    plain = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    assert torch.equal(plain, greedy)
    hf_securesd.patch()  # on again, through the wrapper left in place
    assert GenerationMixin.generate is outer
    assert torch.equal(_speculative(target, draft), greedy)
    hf_securesd.unpatch()
    assert GenerationMixin.generate is outer
    _refused_unpatched(target, draft)
    assert len(calls) == 4  # every call went through it


def test_a_wrapper_that_hides_it_calls_ours_is_saved_without_a_loop(pair, monkeypatch):
    """A library keeps the generate it found while patched (ours) and installs a plain wrapper of it (no
    `__wrapped__`) after the last unpatch(); a later patch() saves that wrapper and installs ours over it:
    ours -> wrapper -> ours must not loop."""
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    hf_securesd.patch()
    kept = GenerationMixin.generate
    hf_securesd.unpatch()

    def plain_wrapper(self, *args, **kwargs):
        return kept(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", plain_wrapper)
    hf_securesd.patch()
    assert torch.equal(_speculative(target, draft), greedy)
    hf_securesd.unpatch()
    assert GenerationMixin.generate is plain_wrapper
    _refused_unpatched(target, draft)


def test_a_replacement_that_does_not_call_ours_is_patched_over_again(pair, monkeypatch):
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    original = hf_securesd.integration._TRANSFORMERS_METHODS[(GenerationMixin, "generate")]
    hf_securesd.patch()

    @functools.wraps(original)
    def replacement(self, *args, **kwargs):  # calls transformers' own, not ours
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", replacement)
    hf_securesd.unpatch()
    hf_securesd.patch()
    assert torch.equal(_speculative(target, draft), greedy)  # SecureSD on again
    hf_securesd.unpatch()
    assert GenerationMixin.generate is replacement


def test_a_securesd_call_nested_in_a_patched_generate_runs_as_securesd(pair):
    """A stopping criterion asks a guard model (here the same one) for a SecureSD answer while the outer
    plain call runs: the nested call was taken for a wrapper loop and reached the loop unprepared."""
    draft, target = pair
    hf_securesd.patch()
    nested: list = []

    class Guard(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            if not nested:
                nested.append(target.generate(PROMPT, assistant_model=draft, verifier="mars", max_new_tokens=8,
                                              do_sample=False, return_dict_in_generate=True))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    target.generate(PROMPT, max_new_tokens=2, do_sample=False, stopping_criteria=StoppingCriteriaList([Guard()]))
    assert nested and nested[0].speculative_stats.rounds > 0


def test_a_patch_racing_another_threads_last_unpatch_stays_installed(pair, monkeypatch):
    """A thread's last unpatch() had counted down to 0 and not yet put transformers' methods back when
    another thread's patch() found ours installed and returned; the unpatch then took ours away under the
    second thread (a speculative call then failed deep inside). Slowed down here at that point, the two
    calls follow each other: what patch() returns to stays installed until its own unpatch()."""
    import threading
    import time

    from hf_securesd import integration

    draft, target = pair
    attributes = integration._PATCHED_ATTRIBUTES

    reads: list[int] = []

    class SlowToRead(tuple):
        def __iter__(self):
            reads.append(1)
            if len(reads) == 2:  # the unpatch below, between counting down and putting methods back
                time.sleep(0.1)
            return super().__iter__()

    monkeypatch.setattr(integration, "_PATCHED_ATTRIBUTES", SlowToRead(attributes))
    hf_securesd.patch()
    last_unpatch = threading.Thread(target=hf_securesd.unpatch)
    last_unpatch.start()
    time.sleep(0.02)  # the unpatch has counted down and is about to put transformers' methods back
    hf_securesd.patch()
    last_unpatch.join()
    try:
        assert GenerationMixin.generate is integration._patched_generate and integration._patching.active
        assert torch.equal(_speculative(target, draft), target.generate(PROMPT, max_new_tokens=8, do_sample=False))
    finally:
        hf_securesd.unpatch()
    assert GenerationMixin.generate is not integration._patched_generate and integration._patching.count == 0
