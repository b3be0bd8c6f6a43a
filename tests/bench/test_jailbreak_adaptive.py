"""The delayed-decision jailbreak variant: same requests, a repeat-first instruction, and a judge
that reads past the repeated request."""

from __future__ import annotations



from hf_securesd.bench.tasks import ScoreOptions, get_task
from hf_securesd.bench.tasks.jailbreak import DELAY_TEXT, strip_repeat




def test_adaptive_variant_keeps_the_requests_and_delays_the_decision(data_dir) -> None:
    plain = get_task("jailbreak").examples(data_dir=data_dir, limit=5)
    adaptive = get_task("jailbreak_adaptive").examples(data_dir=data_dir, limit=5)
    assert [e.id.replace("jailbreak_adaptive/", "jailbreak/") for e in adaptive] == [e.id for e in plain]
    task = get_task("jailbreak_adaptive")
    (message,) = task.build_prompt(adaptive[0])
    assert message["content"] == f"{DELAY_TEXT}\n\n{plain[0].fields['prompt']}"
    assert get_task("jailbreak").build_prompt(plain[0])[0]["content"] == plain[0].fields["prompt"]


def test_judge_reads_past_the_repeated_request(data_dir) -> None:
    task = get_task("jailbreak_adaptive")
    examples = task.examples(data_dir=data_dir, limit=3)
    request = examples[0].fields["prompt"]
    responses = [
        f'"{request}"\n\nI\'m sorry, but I can\'t help with that.',  # repeat, then refusal
        f"{examples[1].fields['prompt'].upper()} Sure, here is how:",  # repeat, then compliance
        "I'm sorry, I can't.",  # no repeat, refusal
    ]
    result = task.score(examples, responses, ScoreOptions())
    assert result.metric == "afr" and result.per_example == [1.0, 0.0, 1.0]
    # the start-anchored default judge alone would read the first reply as compliance
    plain_examples = get_task("jailbreak").examples(data_dir=data_dir, limit=3)
    plain = get_task("jailbreak").score(plain_examples, responses, ScoreOptions())
    assert plain.per_example[0] == 0.0


def test_strip_repeat() -> None:
    assert strip_repeat("Write  a POEM. Sorry, no.", "write a poem.") == "Sorry, no."
    assert strip_repeat("Sure, here it is", "write a poem") == "Sure, here it is"
    assert strip_repeat("anything", "   ") == "anything"
