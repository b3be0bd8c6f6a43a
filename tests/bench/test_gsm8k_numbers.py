"""GSM8K answers of any length are read and compared digit for digit: a number of 29+ digits used
to raise decimal.InvalidOperation while scoring (on every resume of the run), and one of 29+
significant digits with a fraction was rounded to 28 (two different answers compared equal)."""

from __future__ import annotations

import pytest

from hf_securesd.bench.tasks import Example, ScoreOptions, get_task
from hf_securesd.bench.tasks.gsm8k import extract_final_number, is_correct

THIRTY_DIGITS = "123456789012345678901234567890"
HALF = "9" * 32 + ".5"  # was normalized to 1E+32


@pytest.mark.parametrize("text, expected", [
    (f"The total is:\n#### {THIRTY_DIGITS}", THIRTY_DIGITS),
    (f"#### {HALF}", HALF),
    ("#### 1" + "0" * 40 + ".000", "1" + "0" * 40),
    ("#### -0.000000000000000000000000000000001", "-0.000000000000000000000000000000001"),
    ("The answer is 0.0000001", "0.0000001"),  # was "1E-7"
    ("#### 1,234.50", "1234.5"),
    ("#### 007", "7"),
    pytest.param("#### " + "7" * 1_000_001, "7" * 1_000_001, id="past the default exponent range"),
])
def test_long_numbers_are_read_digit_for_digit(text, expected):
    assert extract_final_number(text) == expected


def test_long_numbers_compare_exactly():
    assert is_correct(f"#### {THIRTY_DIGITS}", THIRTY_DIGITS)
    assert not is_correct(f"#### {THIRTY_DIGITS}", THIRTY_DIGITS[:-1] + "1")
    assert not is_correct(f"#### {HALF}", "9" * 32 + ".4")
    assert not is_correct(f"#### {HALF}", "1" + "0" * 32)
    assert is_correct(f"#### {HALF}0", HALF)


def test_scoring_a_thirty_digit_answer_does_not_stop_the_run():
    examples = [Example(id=f"gsm8k/test/{index}", fields={"question": "?", "answer": answer})
                for index, answer in enumerate(["18", THIRTY_DIGITS])]
    responses = [f"#### {THIRTY_DIGITS}", f"So:\n#### {THIRTY_DIGITS}"]
    result = get_task("gsm8k").score(examples, responses, ScoreOptions())
    assert result.per_example == [0.0, 1.0]
    assert [detail["predicted"] for detail in result.details] == [THIRTY_DIGITS, THIRTY_DIGITS]
