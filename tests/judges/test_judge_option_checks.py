"""Judge options are checked before any generation, and none is silently ignored: a StrongREJECT backend
that is no backend, a transformers judge without its model, an unknown unparsed policy, a rubric without
placeholders or a missing data folder (all found without loading a model); backend settings beside a
built backend; `prefixes` beside `prefix_list`; misspelled settings named with the valid ones."""

from __future__ import annotations

import pytest

from hf_securesd.judges import StrongRejectJudge, check_judge_options, get_judge
from hf_securesd.judges.backends import OpenAIChatBackend

RUBRIC = "Goal: {forbidden_prompt}\nResponse: {response}"
LOCAL = {"backend": "transformers", "backend_kwargs": {"model": "org/judge"}, "rubric": RUBRIC}


@pytest.mark.parametrize(("options", "message"), [
    ({"backend": 5}, r"backend must be 'openai', 'transformers' or a ChatBackend object, got 5 \(int\)"),
    ({"backend": [1]}, r"backend must be 'openai', 'transformers' or a ChatBackend object, got \[1\] \(list\)"),
    ({**LOCAL, "unparsed": "exclud"}, "unparsed-verdict policy must be one of fail, exclude, success, not 'exclud'"),
    ({**LOCAL, "rubric": "no placeholders"}, r"lacks the placeholders \['forbidden_prompt', 'response'\]"),
    ({"backend": "transformers", "rubric": RUBRIC}, "the transformers judge backend needs model=<hub id or local"),
    ({"backend": "transformers", "rubric": RUBRIC, "backend_kwargs": {"max_new_tokens": 64}},
     "the transformers judge backend needs model="),
    ({**LOCAL, "backend_kwargs": {"model": "org/judge", "max_new_tokens": 0}},
     r"'max_new_tokens': 0 is not an integer in \[1, 32768\]"),
    ({**LOCAL, "backend_kwargs": {"model": "org/judge", "tmeout": 5}},
     "the transformers judge backend takes no setting 'tmeout'; its settings are model, device, max_new_tokens, "
     "batch_size"),
])
def test_options_that_failed_only_at_scoring_are_refused_before_generation(options, message) -> None:
    """Before, each passed `check_judge_options` (the transformers judge was not built there, and
    backend=5 was kept as the backend) and failed when the task was scored, after generation."""
    with pytest.raises(ValueError, match=message):
        check_judge_options("strongreject", options)


def test_a_missing_data_folder_is_found_before_generation_with_a_transformers_judge() -> None:
    options = {"backend": "transformers", "backend_kwargs": {"model": "org/judge"}, "data_dir": "/nonexistent"}
    with pytest.raises(FileNotFoundError, match="/nonexistent/strongreject/judge_rubric_prompt.txt does not exist"):
        check_judge_options("strongreject", options)


def test_good_transformers_options_pass_without_loading_a_model() -> None:
    check_judge_options("strongreject", {**LOCAL, "backend_kwargs": [["model", "org/judge"], ["batch_size", 2]]})


def test_a_misspelled_endpoint_setting_names_the_valid_ones() -> None:
    """Before: "__init__() got an unexpected keyword argument 'tmeout'"."""
    with pytest.raises(ValueError, match=r"the openai judge backend takes no setting 'tmeout' \(did you mean "
                                         r"'timeout'\?\); its settings are base_url, model, api_key, timeout, "):
        get_judge("strongreject", rubric=RUBRIC, backend_kwargs={"tmeout": 5})


def test_backend_settings_given_as_text_name_the_forms_taken() -> None:
    """Before: "dictionary update sequence element #0 has length 1; 2 is required" (`--judge-option
    'backend_kwargs={"timeout": 5}'` passes the text on)."""
    with pytest.raises(ValueError, match=r"backend_kwargs must be a dict of judge backend settings .*on the command "
                                         r"line --judge-option 'backend_kwargs=\[\[\"timeout\", 60\]\]'\), got str"):
        check_judge_options("strongreject", {"rubric": RUBRIC, "backend_kwargs": '{"timeout": 5}'})
    with pytest.raises(ValueError, match="backend_kwargs has a setting given twice"):
        get_judge("strongreject", rubric=RUBRIC, backend_kwargs=[["timeout", 5], ["timeout", 6]])


def test_settings_beside_a_built_backend_are_refused() -> None:
    """Before, `backend_kwargs` were dropped without a word when `backend` was a built backend."""
    backend = OpenAIChatBackend(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ValueError, match="backend is a built OpenAIChatBackend, which would ignore them"):
        StrongRejectJudge(backend=backend, rubric=RUBRIC, backend_kwargs={"timeout": 5})
    assert StrongRejectJudge(backend=backend, rubric=RUBRIC, backend_kwargs={}).backend is backend


@pytest.mark.parametrize("name", ["refusal_prefix", "refusal_prefix_exact"])
@pytest.mark.parametrize("prefix_list", ["gcg_evaluate", "jailbreakbench", "bogus"])
def test_prefixes_beside_a_prefix_list_are_refused(name: str, prefix_list: str) -> None:
    """Before, `prefix_list` was ignored when `prefixes` were given (even prefix_list="bogus")."""
    with pytest.raises(ValueError, match="give either prefix_list .* or prefixes .*, not both"):
        get_judge(name, prefix_list=prefix_list, prefixes=["Sure"])


@pytest.mark.parametrize("name", ["refusal_prefix", "refusal_prefix_exact"])
def test_a_prefix_list_is_checked_and_the_default_unchanged(name: str) -> None:
    with pytest.raises(ValueError, match=r"unknown prefix list \['x'\]; choose one of jailbreakbench, "):
        get_judge(name, prefix_list=["x"])
    default, explicit = get_judge(name), get_judge(name, prefix_list="jailbreakbench")
    assert default.prefixes == explicit.prefixes and default.prefix_list == explicit.prefix_list == "jailbreakbench"
    assert get_judge(name, prefixes=["Sure"]).prefixes == ("Sure",)
