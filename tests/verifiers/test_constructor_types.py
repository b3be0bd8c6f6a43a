"""Knob types and serialisation of every verifier and schedule: NumPy and 0-d tensor numbers are accepted
and stored as Python numbers, everything else (huge integers included) is refused with a ValueError
naming the knob; option strings ignore case like the rules' names; `to_dict()` is strict JSON, and the
old form with a float infinity still loads to the same verifier."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from hf_securesd import FSD, FLy, MARS, BiLD, Linear, LossySD, Power, Segments, SpecCascade, Step, VLLMFLy
from hf_securesd.schedules import resolve_schedule
from hf_securesd.verifiers import VERIFIERS, resolve_verifier

# (class, real knob, a valid value) for every real knob of every verifier and schedule
REAL_KNOBS = [
    (MARS, "theta", 0.5), (LossySD, "epsilon", 0.5), (BiLD, "tau_rb", 0.5), (BiLD, "tau_fb", 0.5),
    (SpecCascade, "a", 0.5), (FSD, "tau", 0.5), (FLy, "tau", 0.5), (VLLMFLy, "entropy_threshold", 0.5),
    (Power, "gamma", 0.5),
]
INTEGER_KNOBS = [(FLy, "window"), (VLLMFLy, "window"), (VLLMFLy, "entropy_top_k"), (Step, "L"), (Linear, "L"),
                 (Power, "L")]
SCALARS = {
    "np.float32": np.float32, "np.float64": np.float64, "np.float16": np.float16,
    "tensor": lambda value: torch.tensor(value), "tensor64": lambda value: torch.tensor(value, dtype=torch.float64),
    "0-d array": np.array,
}
INTEGERS = {"np.int64": np.int64, "np.int32": np.int32, "tensor": lambda value: torch.tensor(value),
            "0-d array": np.array}


@pytest.mark.parametrize("make", SCALARS.values(), ids=SCALARS)
@pytest.mark.parametrize("cls, knob, value", REAL_KNOBS, ids=lambda item: getattr(item, "__name__", str(item)))
def test_numpy_and_tensor_floats_are_accepted_as_python_floats(cls, knob, value, make):
    """Before the fix np.float32(0.5) and torch.tensor(0.5) were refused as "must be in (0, 1], got 0.5"."""
    config = cls(**{knob: make(value)})
    assert type(getattr(config, knob)) is float and getattr(config, knob) == value
    assert config == cls(**{knob: value})
    json.dumps(config.to_dict(), allow_nan=False)


@pytest.mark.parametrize("make", INTEGERS.values(), ids=INTEGERS)
@pytest.mark.parametrize("cls, knob", INTEGER_KNOBS, ids=lambda item: getattr(item, "__name__", str(item)))
def test_numpy_and_tensor_integers_are_accepted_as_python_ints(cls, knob, make):
    """Before the fix FLy(window=np.int64(2)) was refused while Step(L=np.int64(2)) was accepted."""
    config = cls(**{knob: make(2)})
    assert type(getattr(config, knob)) is int and getattr(config, knob) == 2
    assert config == cls(**{knob: 2})


@pytest.mark.parametrize("cls, knob, value", REAL_KNOBS, ids=lambda item: getattr(item, "__name__", str(item)))
def test_an_integer_knob_keeps_its_type(cls, knob, value):
    config = cls(**{knob: 1})
    assert type(getattr(config, knob)) is int


@pytest.mark.parametrize("huge", [10**400, -(10**400), 10**5000], ids=["1e400", "-1e400", "1e5000"])
@pytest.mark.parametrize("cls, knob, value", REAL_KNOBS, ids=lambda item: getattr(item, "__name__", str(item)))
def test_an_integer_beyond_the_float_range_is_a_value_error_naming_the_knob(cls, knob, value, huge):
    """Before the fix: OverflowError from math.isnan (and FLy(tau=10**400) was accepted, failing in
    verify_step)."""
    with pytest.raises(ValueError, match=knob):
        cls(**{knob: huge})


@pytest.mark.parametrize("cls, knob", [(FSD, "tau"), (BiLD, "tau_rb"), (FLy, "tau"), (VLLMFLy, "entropy_threshold")])
def test_an_integer_knob_beyond_int64_is_stored_as_a_float_the_rules_can_compare(llama_pair, cls, knob):
    """Before the fix FSD(tau=10**30) was accepted and every round raised torch's "int too big to convert"
    (in vLLM: each step fell back to the target's token). It is the rule with the float 1e30."""
    draft, target = llama_pair
    config = cls(**{knob: 10**30})
    assert getattr(config, knob) == 1e30 and type(getattr(config, knob)) is float and config == cls(**{knob: 1e30})
    assert getattr(cls(**{knob: 2**63 - 1}), knob) == 2**63 - 1  # int64 ints keep their type
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    outputs = [target.generate(prompt, max_new_tokens=8, assistant_model=draft, verifier=verifier)
               for verifier in (config, cls(**{knob: 1e30}))]
    assert outputs[0].shape[1] == prompt.shape[1] + 8 and torch.equal(*outputs)


@pytest.mark.parametrize("cls, knob", [(FLy, "window"), (VLLMFLy, "window"), (VLLMFLy, "entropy_top_k")])
def test_an_integer_knob_beyond_int64_is_refused_at_construction(cls, knob):
    """Before the fix FLy(window=10**30) was accepted and failed inside verify_step."""
    with pytest.raises(ValueError, match=rf"{knob}.*at most 2\*\*63 - 1\), got 1000000000000000000000000000000"):
        cls(**{knob: 10**30})
    assert getattr(cls(**{knob: 2**63 - 1}), knob) == 2**63 - 1


@pytest.mark.parametrize("bad", [np.float32(np.nan), torch.tensor(True), np.bool_(True), np.array([0.5]),
                                 torch.tensor([0.5]), 0.5 + 0j, "0.5"], ids=repr)
@pytest.mark.parametrize("cls, knob, value", REAL_KNOBS, ids=lambda item: getattr(item, "__name__", str(item)))
def test_other_values_are_refused_naming_the_knob(cls, knob, value, bad):
    with pytest.raises(ValueError, match=knob):
        cls(**{knob: bad})


@pytest.mark.parametrize("bad, said", [
    ("0.5", "which is str, not a number: pass an int or a float (the number 0.5 itself, not the text '0.5')"),
    ("Infinity", "'Infinity', which is str, not a number: pass an int or a float"),
    (True, "which is a bool, not a number"),
    (None, "which is NoneType, not a number"),
])
@pytest.mark.parametrize("cls, knob, value", REAL_KNOBS,
                         ids=lambda item: getattr(item, "__name__", str(item)))
def test_a_value_that_is_no_number_is_refused_as_such_not_by_range(cls, knob, value, bad, said):
    """Text such as "0.5" (from a command line or JSON) was refused as outside the knob's range."""
    with pytest.raises(ValueError, match=rf"{knob}.*{re.escape(said)}"):
        cls(**{knob: bad})


@pytest.mark.parametrize("bad, said", [
    ("3", "'3', which is str, not a number: pass an int (the number 3 itself, not the text '3')"),
    (True, "True, which is a bool, not a number: pass an int"),
    (None, "None, which is NoneType, not a number: pass an int"),
])
@pytest.mark.parametrize("cls, knob", INTEGER_KNOBS, ids=lambda item: getattr(item, "__name__", str(item)))
def test_an_integer_knob_that_is_no_number_is_refused_as_such(cls, knob, bad, said):
    if cls is VLLMFLy and knob == "window" and bad is None:
        pytest.skip("window=None is vLLM FLy's default window, min(6, k - 1)")
    with pytest.raises(ValueError, match=re.escape(said)):
        cls(**{knob: bad})


@pytest.mark.parametrize("bad", [np.array([2]), torch.tensor([2]), torch.tensor(2.0), np.float64(2.0), np.bool_(True),
                                 torch.tensor(True)], ids=repr)
@pytest.mark.parametrize("cls, knob", INTEGER_KNOBS, ids=lambda item: getattr(item, "__name__", str(item)))
def test_arrays_floats_and_bools_are_not_integer_knobs(cls, knob, bad):
    with pytest.raises(ValueError, match=knob.replace("window", "window W")):
        cls(**{knob: bad})


@pytest.mark.parametrize("name", [["mars"], ("mars",), 3, None, {"verifier": "mars"}])
def test_a_verifier_name_that_is_not_a_string_is_a_clear_error(name):
    """Before the fix resolve_verifier({"verifier": ["mars"]}) raised TypeError: unhashable type: 'list'."""
    with pytest.raises(ValueError, match="a verifier's name must be a string, one of lossless, .*mars"):
        resolve_verifier({"verifier": name})


@pytest.mark.parametrize(
    "cls, option, given, stored",
    [(FSD, "divergence", "JS", "js"), (FSD, "divergence", "Kl", "kl"), (SpecCascade, "rule", "Token", "token"),
     (SpecCascade, "rule", "CHOW", "chow")],
)
def test_option_strings_ignore_case_like_verifier_names(cls, option, given, stored):
    """Before the fix FSD(divergence="JS") and SpecCascade(rule="Token") were refused while "MARS" resolved."""
    config = cls(**{option: given})
    assert getattr(config, option) == stored and config == cls(**{option: stored})
    assert resolve_verifier({"verifier": cls.name.upper(), option: given}) == config


@pytest.mark.parametrize("cls, option", [(FSD, "divergence"), (SpecCascade, "rule")])
@pytest.mark.parametrize("bad", ["jsd", " js", 3, None])
def test_unknown_option_strings_list_the_choices(cls, option, bad):
    with pytest.raises(ValueError, match=f"{cls.__name__} {option} must be one of '"):
        cls(**{option: bad})


@pytest.mark.parametrize("boundary", [np.array([5, 6]), np.array([7], dtype=np.int32), torch.tensor([5, 6])],
                         ids=repr)
def test_a_one_dimensional_array_of_ids_is_one_boundary(boundary):
    """Before the fix Segments(np.array([5, 6])) raised TypeError: only 0-dimensional arrays can be converted."""
    schedule = Segments(boundary)
    assert schedule == Segments(boundary.tolist())
    assert schedule.to_dict()["boundary"] == boundary.tolist()


@pytest.mark.parametrize("boundary", [np.array([[5, 6]]), np.array([5.0]), np.array([-1])], ids=repr)
def test_other_arrays_are_refused_as_boundaries(boundary):
    with pytest.raises(ValueError, match="Segments boundary"):
        Segments(boundary)


def every_configuration() -> list:
    """Every verifier at every sweep value, with an infinite knob wherever one may be infinite."""
    configurations = [verifier for cls in VERIFIERS.values() for verifier in cls.sweep()]
    return configurations + [BiLD(tau_rb=math.inf), FSD(tau=math.inf), FLy(tau=math.inf, window=1),
                             VLLMFLy(entropy_threshold=math.inf, window=2)]


@pytest.mark.parametrize("verifier", every_configuration(), ids=repr)
def test_to_dict_is_strict_json_and_reads_back(verifier):
    """Before the fix FLy(tau=inf).to_dict() (FLy's own lossless sweep end) held a float inf, written as
    the non-standard JSON literal Infinity."""
    text = json.dumps(verifier.to_dict(), allow_nan=False)
    assert resolve_verifier(json.loads(text)) == verifier


@pytest.mark.parametrize("verifier", [FLy(tau=math.inf), VLLMFLy(entropy_threshold=math.inf), BiLD(tau_rb=math.inf),
                                      FSD(tau=math.inf)], ids=repr)
def test_an_infinite_knob_is_the_string_inf_and_the_old_float_form_still_loads(verifier):
    form = verifier.to_dict()
    assert form[verifier.knob] == "inf"
    old_file = json.dumps({**form, verifier.knob: math.inf})  # what generation_config.json held before
    assert "Infinity" in old_file
    assert resolve_verifier(json.loads(old_file)) == verifier
    assert resolve_verifier(json.loads(old_file)).is_lossless == verifier.is_lossless


@pytest.mark.parametrize(
    "build",
    [lambda: Step(L=np.int64(3)), lambda: Step(L=2**70), lambda: Linear(L=torch.tensor(4)),
     lambda: Power(L=4, gamma=np.float32(2.5)),
     lambda: Segments([5, 6], before=Power(L=2, gamma=np.float64(0.5)), after=Step(L=1))],
    ids=["step-np", "step-huge", "linear-tensor", "power-np-gamma", "segments"],
)
def test_schedule_to_dict_is_strict_json_and_reads_back(build):
    schedule = build()
    text = json.dumps(schedule.to_dict(), allow_nan=False)
    assert resolve_schedule(json.loads(text)) == schedule


def test_power_gamma_beyond_the_float_range_is_a_value_error():
    """Before the fix Power(L=2, gamma=10**400) raised OverflowError."""
    with pytest.raises(ValueError, match="gamma"):
        Power(L=2, gamma=10**400)
