"""GSM8K (Cobbe et al., 2021): 200 problems drawn with a fixed seed from the 1,319 test problems;
exact match on the final number.

Hub: `openai/gsm8k` (config `main`, split `test`). Local: `gsm8k/test.jsonl`.
The gold answer is the number after `#### ` at the end of the reference solution.
"""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Sequence

from hf_securesd.bench.data import load_hub, local_file, read_jsonl, seeded_sample, too_few
from hf_securesd.bench.scoring import mean
from hf_securesd.bench.tasks import Example, Message, ScoreOptions, Task, TaskScore
from hf_securesd.judges.refusal_prefix import without_ignorable

HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
LOCAL_PATH = "gsm8k/test.jsonl"
FIELDS = ("question", "answer")
SAMPLE_SIZE = 200
TEST_SIZE = 1319  # problems in the test split: the seeded sample is drawn from all of them
INSTRUCTION = ("Solve the following math problem step by step. End your reply with the final answer "
               "as a single number on its own line, in the form \"#### <number>\".")

# A number: optional sign (not a hyphen between words or digits), optional currency sign, digits
# with or without thousands separators (commas, or the no-break and thin spaces of typeset numbers)
# and optional decimals, or decimals alone (".5"). What
# continues it as a number of another form (a fraction "5/8", an exponent "18e3" or "2⁵", a separator
# not followed by three digits "1,23", a second point "1.2.3", an Arabic decimal or thousands
# separator "3٫5", "1_000", a time "3:30", hexadecimal "0x12", thousands grouped by a space "1 234")
# is part of the match, in `rest`: such a token is not a plain number, and reading its first digits
# ("5" of "5/8") would misread it.
_NUMBER = re.compile(r"(?:(?<![\w)])(?P<sign>[-\u2212]))?\s?\$?\s?"
                     r"(?:(?P<digits>\d{1,3}(?:,\d{3})+(?!\d)"
                     r"|\d{1,3}(?:[\u00a0\u202f\u2009]\d{3})+(?!\d)|\d+)"
                     r"(?P<decimals>\.\d+)?|(?P<bare>\.\d+))"
                     r"(?P<rest>(?:/\d+|[eE][-+]?\d+|,\d+|\.\d+|[\u066b\u066c_:]\d+|(?<=\b0)[xX][0-9A-Fa-f]+"
                     r"|[\u00b2\u00b3\u00b9\u2070-\u2079]+| \d{3}(?!\d))*)")
# LaTeX's \frac{a}{b} (\dfrac, \tfrac; \frac12 without braces), read as the fraction a/b it is
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\s*(?:\{\s*([-\u2212]?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))")
_ANSWER_CUES = (
    re.compile(r"####"),
    re.compile(r"\\boxed\{"),
    re.compile(r"(?:final answer|the answer)\s*(?:is|:|=)", re.IGNORECASE),
    re.compile(r"\banswer\s*:", re.IGNORECASE),
)


def load(data_dir: Path | None, seed: int) -> list[Example]:
    """200 test problems in a random order fixed by `seed`. A source with fewer than the test split's
    `TEST_SIZE` problems (a local copy cut short) is refused: the sample would hold other problems, or
    fewer."""
    if data_dir:
        source: Path | str = local_file(data_dir, LOCAL_PATH)
        problems = read_jsonl(source, FIELDS, problem_fields)
    else:
        source = f"the Hugging Face Hub dataset {HUB_ID} ({HUB_CONFIG}, test)"
        problems = [problem_fields(row) for row in load_hub(HUB_ID, HUB_CONFIG, split="test")]
    if len(problems) < TEST_SIZE:
        raise too_few(source, len(problems), TEST_SIZE, "problems")
    indexed = list(enumerate(problems))
    return [Example(id=f"gsm8k/test/{index}", fields=fields)
            for index, fields in seeded_sample(indexed, SAMPLE_SIZE, seed)]


def problem_fields(row: dict[str, Any]) -> dict[str, str]:
    """An example's fields from a dataset row: the question and the gold answer (`gold_answer`)."""
    return {"question": row["question"], "answer": gold_answer(row["answer"])}


def gold_answer(reference: str) -> str:
    """The number after the last `####` of a reference solution, normalized."""
    number = extract_final_number(reference)
    if number is None:
        raise ValueError(f"GSM8K reference solution without a final number: {reference[-80:]!r}")
    return number


def build_prompt(example: Example) -> list[Message]:
    """One user message: the instruction, then the question."""
    return [{"role": "user", "content": f"{INSTRUCTION}\n\nQuestion: {example.fields['question']}"}]


def _canonical(match: re.Match) -> str | None:
    """The matched number without separators, leading zeros or trailing decimal zeros, digit for
    digit however long it is (Decimal's default context rounded numbers past 28 digits or refused
    them, and overflows past a million); None for a token that is not a plain number (`rest`)."""
    if match["rest"]:
        return None
    whole = re.sub(r"[,\u00a0\u202f\u2009]", "", match["digits"]) if match["digits"] else "0"
    text = ("-" if match["sign"] else "") + whole + (match["decimals"] or match["bare"] or "")
    try:
        value = Decimal(text)  # exact, whatever the context's precision
    except InvalidOperation:
        return None
    return format(value.normalize(Context(prec=len(text), Emax=MAX_EMAX, Emin=MIN_EMIN)), "f")


def _as_fraction(match: re.Match) -> str:
    """A LaTeX fraction's match written as "a/b" (a number of another form: see `_NUMBER`)."""
    numerator, denominator = match[1] or match[2], match[3] or match[4]
    return f"{numerator}/{denominator}"


def extract_final_number(text: str) -> str | None:
    """The final numeric answer in `text`, normalized ("1,234.50" -> "1234.5", "$18." -> "18",
    "-3" -> "-3", ".5" -> "0.5"), or None (also where that answer is a number of another form: "5/8",
    "18e3", "1,23", which match no gold answer rather than as their first digits).

    The first number after the last answer cue wins, trying in turn "####", "\\boxed{",
    "final answer is"/"the answer is", "answer:"; without any cue, the last number in the text.
    Invisible characters (zero-width spaces inside a number) are removed first."""
    text = _LATEX_FRACTION.sub(_as_fraction, without_ignorable(text))
    for cue in _ANSWER_CUES:
        cues = list(cue.finditer(text))
        if cues:
            match = _NUMBER.search(text, cues[-1].end())
            if match:
                return _canonical(match)
    numbers = list(_NUMBER.finditer(text))
    return _canonical(numbers[-1]) if numbers else None


def is_correct(response: str, answer: str) -> bool:
    """Whether the response's final number equals the (normalized) gold answer, exactly (Decimal
    comparison is exact at any length)."""
    predicted = extract_final_number(response)
    return predicted is not None and Decimal(predicted) == Decimal(answer)


def score(examples: Sequence[Example], responses: Sequence[str], options: ScoreOptions) -> TaskScore:
    """Accuracy: exact match of the final number."""
    predicted = [extract_final_number(response) for response in responses]
    per_example = [1.0 if is_correct(response, example.fields["answer"]) else 0.0
                   for example, response in zip(examples, responses)]
    details = [{"predicted": value, "answer": example.fields["answer"]}
               for example, value in zip(examples, predicted)]
    return TaskScore("gsm8k", "accuracy", mean(per_example), per_example, details)


TASKS = (
    Task(name="gsm8k", kind="utility", metric="accuracy",
         description="GSM8K, 200 test problems (seeded sample), exact match on the final number",
         load=load, build_prompt=build_prompt, score_fn=score, max_new_tokens=512),
)
