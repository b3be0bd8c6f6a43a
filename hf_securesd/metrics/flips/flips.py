"""Paired flips: how often a method's per-example binary outcome differs from a reference's, in
each direction, with exact intervals and the exact McNemar test, as an `evaluate` metric.

This file is self-contained (numpy, scipy, datasets, evaluate); with its card, app.py and
requirements.txt it is the Hub Space `securesd/flips` (`hf_securesd.metrics.export("flips", folder)`
writes exactly those files). Load it with `evaluate.load("securesd/flips")` once published, or
offline with `evaluate.load(hf_securesd.metrics.path("flips"))`.
"""

import difflib
import inspect
import math
import numbers
from collections.abc import Collection, Mapping
from collections.abc import Set as AbstractSet
from decimal import Decimal

import datasets
import evaluate
import numpy as np
from scipy.stats import binomtest, norm

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
@article{newcombe1998paired,
  title   = {Improved confidence intervals for the difference between binomial proportions based on paired data},
  author  = {Newcombe, Robert G.},
  journal = {Statistics in Medicine},
  volume  = {17},
  number  = {22},
  pages   = {2635--2650},
  year    = {1998}
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
the method moves the rate at all; Newcombe's paired square-and-add interval of `difference` =
method rate - reference rate says by how much. McNemar's test cannot see flips that cancel:
`flip_rate` and its interval can.
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
    n_resamples (optional): only `n_resamples=0`, which leaves `difference_ci` out (None).
        `difference_ci` is Newcombe's interval, not a bootstrap, so any other count is refused with a
        `ValueError` saying so.
    seed (optional): refused with a `ValueError` if given (None aside): no interval draws anything
        at random.

Returns:
    n_examples, n_lost, n_gained, n_discordant (`int`): counts.
    lost_rate, gained_rate, flip_rate (`float`): counts / n_examples; `*_ci`: exact intervals.
    lost_share (`float` or `None`): n_lost / reference positives (None without any); `lost_share_ci`.
    gained_share (`float` or `None`): n_gained / reference negatives; `gained_share_ci`.
    reference_rate, method_rate (`float`): share of 1s.
    difference (`float`): method_rate - reference_rate = (n_gained - n_lost) / n_examples;
        `difference_ci`: Newcombe's square-and-add interval for paired proportions (method 10 of
        Newcombe 1998: the two rates' Wilson intervals combined with their continuity-corrected
        correlation; within [-1, 1], and of positive width at the usual levels even when nothing
        flips); None only with `n_resamples=0`.
    mcnemar_pvalue (`float`): exact McNemar p-value (1.0 when no pair is discordant).

Examples:
    >>> flips = evaluate.load("securesd/flips")  # offline: evaluate.load(hf_securesd.metrics.path("flips"))
    >>> result = flips.compute(predictions=[1, 0, 1, 1, 0], references=[1, 1, 0, 1, 0])
    >>> result["n_lost"], result["n_gained"], result["flip_rate"], result["mcnemar_pvalue"]
    (1, 1, 0.4, 1.0)
"""

_INTERVAL_CHANGE = (
    "difference_ci is Newcombe's paired interval (it was a percentile bootstrap, which gave zero-width "
    "intervals such as [0.0, 0.0] when no example flips)"
)


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


def _check_inputs_given(metric: evaluate.Metric, given: Mapping[str, object]) -> None:
    """Refuse a `compute` given no input column (each left out or None) when nothing was added before
    with `add` or `add_batch`: `evaluate` would skip `add_batch`, whose checks name a missing column,
    and fail on a missing cache file instead. After `add` or `add_batch`, such a `compute` computes on
    the examples added, as `evaluate`'s does."""
    first, *others = metric._feature_names()
    if metric.writer is None and all(given.get(name) is None for name in (first, *others)):
        raise ValueError(
            f"`{first}` is missing (None), and so is every other input column "
            f"({', '.join(f'`{name}`' for name in others)}); pass each as a list with one entry per example, "
            "or add examples with add() or add_batch() before calling compute() without them."
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


def _confidence_level(level: object) -> float:
    """`confidence_level` as a float strictly between 0 and 1."""
    if not isinstance(level, numbers.Real) or isinstance(level, bool) or not 0 < level < 1:
        raise ValueError(
            f"`confidence_level` must be a number strictly between 0 and 1, got {level!r}; pass e.g. "
            "confidence_level=0.95 for a 95% interval."
        )
    return float(level)


def _check_no_bootstrap(n_resamples: object, seed: object) -> bool:
    """Whether to compute `difference_ci`: `n_resamples=0` leaves it out; any other `n_resamples`, and
    any `seed`, is refused, since Newcombe's interval draws no resamples and nothing at random (None
    stands for an argument left out)."""
    if seed is not None:
        raise ValueError(
            f"`seed` no longer applies to flips: {_INTERVAL_CHANGE}, so nothing is drawn at random; got "
            f"seed={seed!r:.40}: leave seed out."
        )
    if n_resamples is None:
        return True
    if _is_whole(n_resamples) and n_resamples == 0:
        return False
    raise ValueError(
        f"`n_resamples` no longer applies to flips: {_INTERVAL_CHANGE}, so nothing is resampled; got "
        f"n_resamples={n_resamples!r:.40}: leave n_resamples out, or pass n_resamples=0 for no interval."
    )


def _wilson_interval(successes: int, trials: int, z: float) -> tuple[float, float]:
    """Wilson's score interval of successes / trials (trials > 0) at the normal quantile z."""
    share = successes / trials
    centre = (2 * successes + z * z) / (2 * (trials + z * z))
    half = z * math.sqrt(z * z + 4 * successes * (1 - share)) / (2 * (trials + z * z))
    return centre - half, centre + half


def paired_difference_interval(both: int, gained: int, lost: int, neither: int, confidence_level: float) -> list[float]:
    """Newcombe's square-and-add interval (method 10 of Newcombe 1998, Statistics in Medicine 17,
    2635-2650) of method rate - reference rate from the paired counts: `both` examples good for both
    systems, `gained` good for the method only, `lost` good for the reference only, `neither` good for
    neither (at least one example in all). The method's rate p1 = (both + gained) / n and the
    reference's p2 = (both + lost) / n get Wilson intervals [l1, u1], [l2, u2]; their correlation is
    estimated with Newcombe's continuity correction from A = both * neither - gained * lost:
    (A - n/2) / sqrt(product of the four margins) for A > n/2, 0 for 0 <= A <= n/2, A / sqrt(...) for
    A < 0, and 0 when a margin is empty. Then, with d = p1 - p2,

        low  = d - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
        high = d + sqrt((p2 - l2)^2 - 2 phi (p2 - l2)(u1 - p1) + (u1 - p1)^2)

    -> [low, high] (floats within [-1, 1])."""
    n = both + gained + lost + neither
    z = float(norm.isf((1 - confidence_level) / 2))  # the upper quantile, finite for levels just below 1
    method_rate, reference_rate = (both + gained) / n, (both + lost) / n
    method_low, method_high = _wilson_interval(both + gained, n, z)
    reference_low, reference_high = _wilson_interval(both + lost, n, z)
    margins = (both + gained) * (lost + neither) * (both + lost) * (gained + neither)
    association = both * neither - gained * lost
    if margins == 0 or 0 <= association <= n / 2:
        phi = 0.0
    else:
        phi = (association - n / 2 if association > 0 else association) / math.sqrt(margins)
    difference = method_rate - reference_rate

    def spread(own: float, other: float) -> float:
        """The square-and-add half-width from this side's two distances to the Wilson limits."""
        return math.sqrt(max(own * own - 2 * phi * own * other + other * other, 0.0))

    low = difference - spread(method_rate - method_low, reference_high - reference_rate)
    high = difference + spread(reference_rate - reference_low, method_high - method_rate)
    return [max(low, -1.0), min(high, 1.0)]


def _share(count, total):
    return float(count) / total if total else None


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Flips(evaluate.Metric):
    """Per-direction flip rates of paired binary outcomes against a reference, with McNemar's test."""

    def compute(self, **kwargs):
        """`evaluate`'s `compute`, refusing an argument it does not take (a misspelled option), naming
        the ones it takes, and a call without inputs when none were added (`_check_inputs_given`)."""
        _check_arguments(self, kwargs)
        _check_inputs_given(self, kwargs)
        return super().compute(**kwargs)

    def add_batch(self, **columns):
        """`evaluate`'s `add_batch` (which `compute` calls), refusing a column that is missing or not a
        list of numbers a float64 holds: `evaluate` would read a bare string such as "101" character by
        character, parse "1", and fail without naming the column on None or on 10**400. The checked
        columns reach `evaluate` as plain lists: it reads a column's first entry as column[0], which a
        pandas Series with another index (a filtered DataFrame's column) looks up as a label (KeyError: 0)."""
        for name in self._feature_names():
            _check_rows(name, columns.get(name), "outcome per example")
            _check_numbers(name, columns[name])
        rows = {name: list(columns[name]) for name in self._feature_names()}
        return super().add_batch(**{**columns, **rows})

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
        n_resamples=None,
        seed=None,
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
        with_interval = _check_no_bootstrap(n_resamples, seed)

        lost = int(((reference == 1) & (method == 0)).sum())
        gained = int(((reference == 0) & (method == 1)).sum())
        discordant = lost + gained
        positives = int(reference.sum())
        negatives = n - positives
        pvalue = 1.0 if discordant == 0 else float(binomtest(lost, discordant, 0.5, alternative=alternative).pvalue)

        difference_ci = None
        if with_interval:
            both = int(((reference == 1) & (method == 1)).sum())
            difference_ci = paired_difference_interval(both, gained, lost, n - both - gained - lost, confidence_level)

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
