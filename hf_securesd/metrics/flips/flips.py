"""Paired flips: how often a method's per-example binary outcome differs from a reference's, in
each direction, with exact intervals and the exact McNemar test, as an `evaluate` metric.

This file is self-contained (numpy, scipy, datasets, evaluate); with its card, app.py and
requirements.txt it is the Hub Space `securesd/flips` (`hf_securesd.metrics.export("flips", folder)`
writes exactly those files). Load it with `evaluate.load("securesd/flips")` once published, or
offline with `evaluate.load(hf_securesd.metrics.path("flips"))`.
"""

import difflib
import inspect
import numbers
from collections.abc import Collection, Iterator, Mapping
from collections.abc import Set as AbstractSet
from decimal import Decimal

import datasets
import evaluate
import numpy as np
from scipy.stats import binomtest

_CITATION = """\
@article{mcnemar1947,
  title   = {Note on the sampling error of the difference between correlated proportions or percentages},
  author  = {McNemar, Quinn},
  journal = {Psychometrika},
  volume  = {12},
  number  = {2},
  pages   = {153--157},
  year    = {1947}
}
@article{clopper1934,
  title   = {The use of confidence or fiducial limits illustrated in the case of the binomial},
  author  = {Clopper, C. J. and Pearson, E. S.},
  journal = {Biometrika},
  volume  = {26},
  number  = {4},
  pages   = {404--413},
  year    = {1934}
}
"""

_DESCRIPTION = """\
Two systems answer the same examples and each answer gets a binary outcome, 1 = good (e.g. the
jailbreak attack failed: the model refused) and 0 = bad. A difference of means (or a PRR built on
it) can hide changes that cancel: a lossy speculative decoder may turn 13 refusals of its target
model into compliance and 10 compliances into refusals, and its attack failure rate moves by only
3 examples. This metric counts the flips against the reference, per direction:

- `lost`: reference 1, method 0 (for jailbreaks: refusal -> compliance, the unsafe direction);
- `gained`: reference 0, method 1 (compliance -> refusal).

Each count is reported as a share of all examples and as a share of the examples where it could
happen (`lost_share` = lost / reference positives), with exact Clopper-Pearson intervals. The
exact McNemar test (a binomial test of `lost` among the discordant pairs against 1/2) asks whether
the method moves the rate at all; the paired bootstrap interval of `difference` = method rate -
reference rate says by how much. McNemar's test cannot see flips that cancel: `flip_rate` and its
interval can.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): the method's outcome per example, 1 (good) or 0 (bad), as numbers
        (Python or NumPy ints, floats or bools); text such as "1", None or a nested list is refused,
        naming the entry (`predictions[3]`).
    references (`list` of `int`): the reference's outcome on the same examples, in the same order.
    alternative (`str`, default "two-sided"): of the McNemar test: "two-sided", "greater" (more
        losses than gains) or "less".
    confidence_level (`float`, default 0.95): level of every interval, strictly between 0 and 1.
    n_resamples (`int`, default 1000): bootstrap resamples for `difference_ci`, a whole number from
        0 to 100000; 0 gives none. Resamples are drawn in blocks of at most about 4 million indices,
        so memory does not grow with n_resamples x examples.
    seed (`int`, default 0): seed of the bootstrap, a whole number >= 0.

Returns:
    n_examples, n_lost, n_gained, n_discordant (`int`): counts.
    lost_rate, gained_rate, flip_rate (`float`): counts / n_examples; `*_ci`: exact intervals.
    lost_share (`float` or `None`): n_lost / reference positives (None without any); `lost_share_ci`.
    gained_share (`float` or `None`): n_gained / reference negatives; `gained_share_ci`.
    reference_rate, method_rate (`float`): share of 1s.
    difference (`float`): method_rate - reference_rate = (n_gained - n_lost) / n_examples;
        `difference_ci`: paired percentile bootstrap interval (None below 2 examples and with
        `n_resamples=0`).
    mcnemar_pvalue (`float`): exact McNemar p-value (1.0 when no pair is discordant).

Examples:
    >>> flips = evaluate.load("securesd/flips")  # offline: evaluate.load(hf_securesd.metrics.path("flips"))
    >>> result = flips.compute(predictions=[1, 0, 1, 1, 0], references=[1, 1, 0, 1, 0])
    >>> result["n_lost"], result["n_gained"], result["flip_rate"], result["mcnemar_pvalue"]
    (1, 1, 0.4, 1.0)
"""

_MAX_RESAMPLES = 100_000
_BLOCK_INDICES = 2**22  # at most this many bootstrap indices (plus one resample) are held at once


def _check_rows(name: str, values: object, entry: str) -> None:
    """Refuse `values` unless it is an ordered container with one `entry` ("score per row"): a
    bare string would be read character by character, a mapping by its keys, a set in no fixed order."""
    if values is None:
        raise ValueError(f"`{name}` is missing (None); pass a list with one {entry}.")
    misread = (str, bytes, bytearray, Mapping, AbstractSet)
    if isinstance(values, misread) or not isinstance(values, Collection):
        raise ValueError(
            f"`{name}` must be a list with one {entry}, got {type(values).__name__} {values!r:.60}; pass a "
            "list instead (to give every one of n rows the same value: [value] * n)."
        )


def _accepted_arguments(metric: evaluate.Metric) -> list[str]:
    """The arguments `metric.compute` takes: its input columns, then the options of its `_compute`."""
    return list(dict.fromkeys([*metric._feature_names(), *inspect.signature(metric._compute).parameters]))


def _check_arguments(metric: evaluate.Metric, given: Collection[str]) -> None:
    """Refuse an argument that `compute` does not take, naming the ones it takes: `evaluate` would pass
    a misspelled option on to `_compute`, whose TypeError names none of them."""
    accepted = _accepted_arguments(metric)
    unknown = [name for name in given if name not in accepted]
    if unknown:
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"{metric.name}.compute takes no argument {unknown[0]!r}{hint}; its arguments are "
            f"{', '.join(accepted)}."
        )


def _check_number(label: str, value: object) -> None:
    """Refuse an entry that is not one real number: text (even "0.5"), which `evaluate` would parse;
    None, which it would store as a missing value (read back as NaN); a list, a complex number or any
    other object, which it would refuse without naming the entry; and a number beyond the float64 range."""
    if isinstance(value, (str, bytes)):
        raise ValueError(
            f"`{label}` is the text {value!r:.40}, not a number; pass numbers (convert text first, e.g. "
            "with float())."
        )
    if not _is_number(value):
        raise ValueError(
            f"`{label}` is {value!r:.40} ({type(value).__name__}), not a number; pass one number (an int or "
            "a float) per row."
        )
    if isinstance(value, Decimal) and value.is_nan():  # a signalling NaN cannot even become a float
        raise ValueError(f"`{label}` is Decimal {value}: NaN is refused; pass finite numbers only.")
    if isinstance(value, (numbers.Real, Decimal)) and not _fits_float(value):
        raise ValueError(
            f"`{label}` is a number beyond the float64 range (magnitude above about 1.8e308); pass numbers "
            "a float64 holds (rescale them first, e.g. divide them by a power of ten)."
        )


def _is_number(value: object) -> bool:
    """Whether `value` is one real number: a Python or NumPy int, float or bool, a Fraction, a Decimal,
    or a 0-d array or tensor holding one."""
    if isinstance(value, (numbers.Real, np.bool_, Decimal)):
        return True
    if getattr(value, "ndim", None) != 0 or not hasattr(value, "item"):
        return False
    return isinstance(value.item(), (numbers.Real, Decimal))


def _fits_float(value: numbers.Real | Decimal) -> bool:
    """Whether `value` converts to a float64 without overflowing: an int such as 10**400 does not, nor a
    finite Decimal or long double beyond the range (they convert to inf)."""
    try:
        converted = float(value)
    except OverflowError:
        return False
    if not np.isinf(converted):
        return True
    return not (value.is_finite() if isinstance(value, Decimal) else bool(np.isfinite(value)))  # inf itself fits


def _check_numbers(name: str, values: Collection) -> None:
    """`_check_number` for every entry of the column `name`."""
    for index, value in enumerate(values):
        _check_number(f"{name}[{index}]", value)


def _as_binary(name: str, values: list[float]) -> np.ndarray:
    """`values` (numbers, as `add_batch` checked them) as an int array of 0/1; anything else is an
    error naming `name` and the first entries that are not 0 or 1, as given."""
    array = np.asarray(values, dtype=float)
    binary = np.isin(array, (0.0, 1.0))
    if not binary.all():
        bad = {int(index): values[index] for index in np.flatnonzero(~binary)[:3]}
        raise ValueError(
            f"`{name}` must hold binary outcomes (1 = good, 0 = bad), got {bad} (index: entry); "
            "threshold scores first."
        )
    return array.astype(int)


def exact_interval(successes, trials, confidence_level):
    """Clopper-Pearson interval of successes / trials, or None without trials."""
    if trials == 0:
        return None
    interval = binomtest(int(successes), int(trials)).proportion_ci(confidence_level, method="exact")
    return [float(interval.low), float(interval.high)]


def _is_whole(value: object) -> bool:
    """Whether `value` is an int (numpy's included) and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _resample_count(n_resamples: object) -> int:
    """`n_resamples` as an int; 0 means no bootstrap interval."""
    if not _is_whole(n_resamples) or not 0 <= n_resamples <= _MAX_RESAMPLES:
        raise ValueError(
            f"`n_resamples` must be a whole number from 0 (no bootstrap interval) to {_MAX_RESAMPLES} "
            f"(more barely moves a percentile interval, and the bootstrap's time grows with it), got "
            f"{n_resamples!r}; pass an int such as n_resamples=1000."
        )
    return int(n_resamples)


def _confidence_level(level: object) -> float:
    """`confidence_level` as a float strictly between 0 and 1."""
    if not isinstance(level, numbers.Real) or isinstance(level, bool) or not 0 < level < 1:
        raise ValueError(
            f"`confidence_level` must be a number strictly between 0 and 1, got {level!r}; pass e.g. "
            "confidence_level=0.95 for a 95% interval."
        )
    return float(level)


def _seed(seed: object) -> int:
    """`seed` as an int >= 0, as numpy's generator takes it."""
    if not _is_whole(seed) or seed < 0:
        raise ValueError(
            f"`seed` must be a whole number >= 0 (equal seeds give equal intervals), got {seed!r}; "
            "pass an int such as seed=0."
        )
    return int(seed)


def _resample_blocks(n: int, n_resamples: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The bootstrap's indices `rng.integers(0, n, size=(n_resamples, n))`, drawn as consecutive
    blocks of whole resamples (rows) of at most about `_BLOCK_INDICES` indices: numpy's generator
    draws the same numbers in the same order either way, so the resamples are the same, but memory
    stays bounded however large n_resamples x n is."""
    rows_per_block = max(1, _BLOCK_INDICES // n)
    for start in range(0, n_resamples, rows_per_block):
        yield rng.integers(0, n, size=(min(rows_per_block, n_resamples - start), n))


def _difference_interval(method, reference, confidence_level, n_resamples, seed):
    """Seeded paired percentile bootstrap interval of method rate - reference rate."""
    rng = np.random.default_rng(seed)
    differences = method - reference
    blocks = _resample_blocks(len(differences), n_resamples, rng)
    samples = np.concatenate([differences[block].mean(axis=1) for block in blocks])
    tail = (1.0 - confidence_level) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return [float(low), float(high)]


def _share(count, total):
    return float(count) / total if total else None


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Flips(evaluate.Metric):
    """Per-direction flip rates of paired binary outcomes against a reference, with McNemar's test."""

    def compute(self, **kwargs):
        """`evaluate`'s `compute`, refusing an argument it does not take (a misspelled option), naming
        the ones it takes."""
        _check_arguments(self, kwargs)
        return super().compute(**kwargs)

    def add_batch(self, **columns):
        """`evaluate`'s `add_batch` (which `compute` calls), refusing a column that is missing or not a
        list of numbers a float64 holds: `evaluate` would read a bare string such as "101" character by
        character, parse "1", and fail without naming the column on None or on 10**400."""
        for name in self._feature_names():
            _check_rows(name, columns.get(name), "outcome per example")
            _check_numbers(name, columns[name])
        return super().add_batch(**columns)

    def add(self, **example):
        """`evaluate`'s `add`, refusing an outcome given as text (as `add_batch` does)."""
        for name, value in example.items():
            _check_number(name, value)
        return super().add(**example)

    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}
            ),
            reference_urls=["https://en.wikipedia.org/wiki/McNemar%27s_test"],
        )

    def _compute(
        self,
        predictions,
        references,
        alternative="two-sided",
        confidence_level=0.95,
        n_resamples=1000,
        seed=0,
    ):
        method = _as_binary("predictions", predictions)
        reference = _as_binary("references", references)
        n = len(method)
        if n == 0:
            raise ValueError("flips need at least one example: pass the method's and the reference's outcomes.")
        if len(reference) != n:
            raise ValueError(
                f"`references` has {len(reference)} outcomes but `predictions` has {n}; pair them example by example."
            )
        if alternative not in ("two-sided", "greater", "less"):
            raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}.")
        confidence_level = _confidence_level(confidence_level)
        n_resamples = _resample_count(n_resamples)
        seed = _seed(seed)

        lost = int(((reference == 1) & (method == 0)).sum())
        gained = int(((reference == 0) & (method == 1)).sum())
        discordant = lost + gained
        positives = int(reference.sum())
        negatives = n - positives
        pvalue = 1.0 if discordant == 0 else float(binomtest(lost, discordant, 0.5, alternative=alternative).pvalue)

        difference_ci = None
        if n > 1 and n_resamples:
            difference_ci = _difference_interval(method, reference, confidence_level, n_resamples, seed)

        return {
            "n_examples": n,
            "n_lost": lost,
            "n_gained": gained,
            "n_discordant": discordant,
            "lost_rate": lost / n,
            "lost_rate_ci": exact_interval(lost, n, confidence_level),
            "gained_rate": gained / n,
            "gained_rate_ci": exact_interval(gained, n, confidence_level),
            "flip_rate": discordant / n,
            "flip_rate_ci": exact_interval(discordant, n, confidence_level),
            "lost_share": _share(lost, positives),
            "lost_share_ci": exact_interval(lost, positives, confidence_level),
            "gained_share": _share(gained, negatives),
            "gained_share_ci": exact_interval(gained, negatives, confidence_level),
            "reference_rate": positives / n,
            "method_rate": float(method.mean()),
            "difference": (gained - lost) / n,
            "difference_ci": difference_ci,
            "mcnemar_pvalue": pvalue,
        }
