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


@pytest.mark.parametrize("text, gold, expected", [
    ("#### .5", "5", "0.5"),             # was read as 5
    ("#### 5/8", "5", None),             # a fraction, not its numerator
    ("#### 18e3", "18", None),           # an exponent, not its mantissa
    ("#### 1,23", "1", None),            # a separator not followed by three digits
    ("version 1.2.3", "3", None),        # two points
    ("... = \\$437,5", "5", None),       # a reply cut mid-number (a recorded study response)
    ("#### 2\u2075", "2", None),          # a superscript exponent
    ("#### 3\u066b5", "3", None),         # the Arabic decimal separator
    ("#### 1_000", "1", None),           # Python's digit separator
    ("#### 3:30", "3", None),            # a time
    ("#### 0x12", "0", None),            # hexadecimal
    ("#### 1 234", "1", None),           # thousands grouped by a space
    ("\\boxed{\\frac{1}{2}}", "1", None),  # LaTeX's fraction: 1/2
    ("\\boxed{\\dfrac{18}{1}}", "18", None),
    ("\\boxed{\\frac12}", "12", None),   # without braces: 1/2
    ("\\boxed{\\frac{-3}{4}}", "-3", None),
])
def test_a_number_of_another_form_is_not_read_as_its_first_digits(text, gold, expected):
    """Each of these used to be read as the digits it starts (or ends) with, and so scored correct against
    that gold answer."""
    assert extract_final_number(text) == expected
    assert not is_correct(text, gold)


@pytest.mark.parametrize("text, expected", [
    ("The answer is $18.", "18"), ("It is 42.", "42"), ("so 3.5 and 4", "4"), ("#### 18,000", "18000"),
    ("#### \u22125", "-5"), ("1, 2, 3 and 4", "4"), ("10 eggs", "10"),
    ("#### 1\u200b8", "18"),  # a zero-width space inside the number was read as 1
    ("#### 100 people", "100"), ("#### 72\n\nDone at 10:30", "72"),
    ("#### 1\u00a0234", "1234"), ("#### 1\u202f234", "1234"), ("#### -1\u2009000.5", "-1000.5"),  # typeset
])
def test_plain_numbers_beside_punctuation_are_still_read(text, expected):
    assert extract_final_number(text) == expected
