"""Performance recovery ratio (PRR) and its paired difference (ΔPRR), as an `evaluate` metric.

This file is self-contained (numpy, datasets, evaluate); with its card, app.py and requirements.txt it
is the Hub Space `securesd/prr` (`hf_securesd.metrics.export("prr", folder)` writes exactly those files).
Load it with `evaluate.load("securesd/prr")` once published, or offline with
`evaluate.load(hf_securesd.metrics.path("prr"))`.
"""

import difflib
import inspect
import numbers
import warnings
from collections.abc import Collection, Iterator, Mapping
from collections.abc import Set as AbstractSet
from decimal import Decimal

import datasets
import evaluate
import numpy as np

_CITATION = """\
@misc{securesd2026,
  title  = {SecureSD: Safe Lossy Speculative Decoding},
  year   = {2026},
  note   = {Defines the performance recovery ratio (PRR) used to compare speculative decoding
            verifiers between a draft-only and a target-only model}
}
"""

_DESCRIPTION = """\
The performance recovery ratio (PRR) places a speculative decoding method on the scale spanned by
its two models: with every raw score oriented higher-is-better,

    PRR = (x - x_draft) / (x_target - x_draft)

so 0 is the draft model alone and 1 is the target model alone. The raw score x is any benchmark
score (pass@1, accuracy, attack failure rate, ...). Per-example scores are averaged first; the
ratio is then taken of the means, and a seeded percentile bootstrap over examples gives a
confidence interval.

The ratio is unchanged when every score is negated, so its value does not depend on orientation;
`higher_is_better` decides the reported `target_gap` and the warning raised when the target scores
worse than the draft (a sign that the orientation is wrong). When x_target equals x_draft up to
rounding (|x_target - x_draft| <= 1e-12 * max(|x_target|, |x_draft|), a tolerance relative to the
scores' own scale) the ratio is undefined: the metric returns NaN, sets `undefined` and warns,
never dividing by zero. Scores of any magnitude a float64 holds work: each setting's scores are
rescaled by a power of two (exactly) before any mean or difference is taken, so nothing overflows,
and a setting of tiny scores keeps its precision beside a setting of huge ones. Within a setting all
columns share the scale of its largest score: one below 2**-1074 of it reads as 0.

With `settings` (one hyperparameter setting per row) the PRR is computed per setting and averaged
over the sweep. With `baseline_predictions` (the same verifier and setting without SecureSD) it
also reports the paired difference ΔPRR = PRR(with) - PRR(without), averaged over the sweep.
When the settings share their examples (a sweep run on one prompt set), `example_ids` makes the
bootstrap resample examples across all settings at once (a cluster bootstrap).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): the method's raw scores, one per example, or a single
        aggregate score (a list of length one). Scores are numbers (Python or NumPy ints, floats
        or bools, 0-d arrays): a string, even "0.5", None, a nested list or any other entry is
        refused in every score list, naming the entry (`predictions[3]`), and so is NaN or inf.
    target_scores (`list` of `float`): the target-only model's scores, aligned with `predictions`.
        PRR takes no `references`: the target-only and draft-only scores take their place.
    draft_scores (`list` of `float`): the draft-only model's scores, aligned with `predictions`.
    higher_is_better (`bool`, default `True`): orientation of the raw score. Use `False` for
        scores such as attack success rate. Only `True` or `False` is accepted.
    settings (`list`, optional): the hyperparameter setting of each row (a number, a string, None,
        a tuple...). Rows with equal settings form a group, compared by value as Python's `==`
        does (`1`, `1.0` and `True` are one setting, `None` and `"None"` two); PRR is computed per
        group and averaged over the groups. An unhashable setting (a list, a dict) is grouped and
        named by its `repr`; NaN is refused.
    baseline_predictions (`list` of `float`, optional): the paired scores of the method without
        SecureSD (same verifier, setting and example as each row). Enables ΔPRR.
    example_ids (`list`, optional): the example (prompt) of each row, a string or an int. Without it
        the bootstrap resamples each setting's rows on their own, as independent samples. When the
        settings of a sweep ran on the same examples, pass it: the bootstrap then resamples examples,
        and an example drawn brings its rows in every setting along, so the correlation between
        settings that share an example is kept (resampling each setting apart would treat them as
        independent, and the interval of an average over settings would come out too narrow). A
        setting may lack some examples (a resample without any of its examples counts as undefined).
    confidence_level (`float`, default 0.95): level of the bootstrap interval, strictly between 0 and 1.
    n_resamples (`int`, default 1000): bootstrap resamples, a whole number from 0 to 100000; 0 gives
        no interval. Resamples are drawn in blocks of at most about 4 million indices, so memory
        does not grow with n_resamples x examples.
    seed (`int`, default 0): seed of the bootstrap, a whole number >= 0; equal seeds give equal
        intervals.

Returns:
    prr (`float`): PRR, averaged over settings; NaN when undefined.
    undefined (`bool`): True when x_target == x_draft (up to the relative tolerance) for some setting.
    method_score, target_score, draft_score (`float`): mean raw scores, as given (averaged over
        settings).
    target_gap (`float`): x_target - x_draft in the higher-is-better sense; positive when the
        target beats the draft (±inf when the gap itself exceeds the float64 range).
    prr_ci (`list` of two `float`, or `None`): bootstrap interval of `prr`; `None` for aggregate
        scores (a setting with a single row), when PRR is undefined and with `n_resamples=0`. A
        zero-width interval, or one resting on a minority of resamples, raises a RuntimeWarning.
    per_setting (`dict`): keyed by setting (as first given; "all" without `settings`), its PRR
        (and baseline PRR and ΔPRR when given).
    n_examples (`int`): number of rows.
    With `baseline_predictions` also:
    baseline_prr (`float`): PRR without SecureSD, averaged over settings.
    delta_prr (`float`): mean over settings of PRR(with) - PRR(without).
    delta_prr_ci (`list` of two `float`, or `None`): paired bootstrap interval of `delta_prr`.
    ci_undefined_resamples (`int`): bootstrap resamples dropped because x_target == x_draft in them
        (or, with `example_ids`, because a setting drew none of its examples).

Examples:
    Table 3 of the SecureSD paper (Qwen3 jailbreak AFR: target .895, draft .195):

    >>> prr = evaluate.load("securesd/prr")  # offline: evaluate.load(hf_securesd.metrics.path("prr"))
    >>> result = prr.compute(predictions=[0.7158], target_scores=[0.895], draft_scores=[0.195])
    >>> round(result["prr"], 3)
    0.744
"""

_RELATIVE_TOLERANCE = 1e-12
_MAX_RESAMPLES = 100_000
_DROPPED_SHARE = 0.05  # above this share of undefined (dropped) resamples the intervals are flagged
_BLOCK_INDICES = 2**22  # at most this many bootstrap indices (plus one resample) are held at once


def _ties(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """Where the target and draft scores are equal up to rounding: their gap is at most
    `_RELATIVE_TOLERANCE` times the larger magnitude (both exactly 0 included)."""
    return np.abs(target - draft) <= _RELATIVE_TOLERANCE * np.maximum(np.abs(target), np.abs(draft))


def _prr(method: np.ndarray, target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """Elementwise PRR of mean scores, each given in the units of its setting's `_unit_exponent`
    (so no difference overflows); NaN where the target and draft means tie."""
    undefined = _ties(target, draft)
    return np.where(undefined, np.nan, (method - draft) / np.where(undefined, 1.0, target - draft))


def _unit_exponent(scores: list[np.ndarray]) -> int:
    """The exponent e of the power of two 2**e just above the largest magnitude in `scores`. Scores
    divided by it (exactly, 2**e being a power of two) lie in (-1, 1), so no mean or difference of
    them overflows even for scores near the float64 limit; PRR, a ratio of differences, is the same."""
    largest = max(float(np.abs(values).max()) for values in scores)
    return int(np.frexp(largest)[1])


def _rescaled(columns: dict[str, np.ndarray], groups: dict) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every column with each group's rows divided by 2**e, e the `_unit_exponent` of that group's
    scores (in all columns), and those exponents, one per group. PRR is a ratio within a group, so
    it is unchanged, and a group of tiny scores is not flushed to 0 by a group of huge ones."""
    exponents = np.array(
        [_unit_exponent([column[rows] for column in columns.values()]) for rows in groups.values()]
    )
    scaled = {name: np.empty_like(column) for name, column in columns.items()}
    for rows, exponent in zip(groups.values(), exponents):
        for name, column in columns.items():
            scaled[name][rows] = np.ldexp(column[rows], -exponent)
    return scaled, exponents


def _mean_in_units(group_means: np.ndarray, exponents: np.ndarray, exponent: int) -> float:
    """The mean of group means given in units of 2**`exponents` (one per group), in units of
    2**`exponent`, the largest of them (so it stays within (-1, 1))."""
    return float(np.ldexp(group_means, exponents - exponent).mean())


def _from_units(value: float, exponent: int) -> float:
    """`value`, given in units of 2**`exponent`, as a raw score (±inf beyond the float64 range)."""
    with np.errstate(over="ignore"):
        return float(np.ldexp(value, exponent))


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


def _as_float_array(name: str, values: object) -> np.ndarray:
    """Validate one column: a list of finite numbers, one per row."""
    _check_rows(name, values, "score per row")
    _check_numbers(name, values)
    array = np.asarray(values, dtype=float)
    _check_finite(name, array)
    return array


def _check_finite(name: str, array: np.ndarray) -> None:
    """Refuse a NaN or infinite score, naming the first one's index."""
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(
            f"`{name}[{bad[0]}]` is {array[bad[0]]}: NaN or infinite scores are refused; pass finite raw "
            "scores only (drop the rows without one)."
        )


class _Unhashable:
    """Group key of an unhashable setting (a list, a dict): equal when the settings' `repr`s are."""

    def __init__(self, setting):
        self.name = repr(setting)

    def __eq__(self, other):
        return isinstance(other, _Unhashable) and other.name == self.name

    def __hash__(self):
        return hash((_Unhashable, self.name))


def _group_key(index, setting):
    """The key that groups `setting`: the value itself when hashable (so `1` and `1.0` share a
    group, `None` and `"None"` do not), else its `repr`. An array or tensor is read as its value (a 0-d
    one as its number: a tensor hashes by identity, so two equal ones would make two groups). NaN equals
    nothing and is refused, also inside a tuple."""
    if getattr(setting, "ndim", None) is not None and callable(getattr(setting, "tolist", None)):
        setting = setting.tolist()  # a number for 0-d, else a (nested) list: grouped by its repr
    if _holds_nan(setting):
        raise ValueError(
            f"`settings[{index}]` is or holds NaN, which equals no other setting; name every setting by a "
            "value equal to itself (a number, a string, None or a tuple of those)."
        )
    try:
        hash(setting)
    except TypeError:
        return _Unhashable(setting)
    return setting


def _holds_nan(setting) -> bool:
    """Whether `setting` is NaN (a float, NumPy or Decimal one) or a tuple or frozenset holding one."""
    if isinstance(setting, (tuple, frozenset)):
        return any(_holds_nan(item) for item in setting)
    if isinstance(setting, Decimal):
        return setting.is_nan()
    return isinstance(setting, (float, np.floating, complex, np.complexfloating)) and setting != setting


def _setting_name(key, keys):
    """How `per_setting` names the group `key`: the setting itself, or the `repr` of an unhashable
    one (an error when that `repr` is also the name of a hashable setting)."""
    if not isinstance(key, _Unhashable):
        return key
    if key.name in keys:
        raise ValueError(
            f"`settings` holds both the string {key.name!r} and an unhashable setting written the same "
            "way; give settings of one type."
        )
    return key.name


def _group_rows(settings, n_rows):
    """Row indices of each setting, named as in `per_setting`, in order of first appearance."""
    if settings is None:
        return {"all": np.arange(n_rows)}
    _check_rows("settings", settings, "hyperparameter setting per row")
    if len(settings) != n_rows:
        raise ValueError(
            f"`settings` has {len(settings)} entries but there are {n_rows} score rows; "
            "give one setting per row."
        )
    groups = {}
    for index, setting in enumerate(settings):
        groups.setdefault(_group_key(index, setting), []).append(index)
    return {_setting_name(key, groups): np.asarray(rows) for key, rows in groups.items()}


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


def _orientation(higher_is_better: object) -> bool:
    """`higher_is_better` as a bool; a string such as "False" is refused, not read as True."""
    if not isinstance(higher_is_better, (bool, np.bool_)):
        raise ValueError(
            f"`higher_is_better` must be True or False, got {higher_is_better!r}; pass the bool True for "
            "scores where higher is better (accuracy, AFR) and False for the others (attack success rate)."
        )
    return bool(higher_is_better)


def _oriented_gap(target_mean: float, draft_mean: float, higher_is_better: bool) -> float:
    """x_target - x_draft in the higher-is-better sense, warning when the target scores clearly
    (beyond a tie) worse than the draft, a sign that the orientation is wrong."""
    gap = (target_mean - draft_mean) * (1.0 if higher_is_better else -1.0)
    if gap < 0 and not _ties(target_mean, draft_mean):
        warnings.warn(
            "The target-only model scores worse than the draft-only model under "
            f"higher_is_better={higher_is_better}; check the orientation of the scores.",
            UserWarning,
            stacklevel=3,
        )
    return gap


def _resample_blocks(n: int, n_resamples: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The bootstrap's indices `rng.integers(0, n, size=(n_resamples, n))`, drawn as consecutive
    blocks of whole resamples (rows) of at most about `_BLOCK_INDICES` indices: numpy's generator
    draws the same numbers in the same order either way, so the resamples are the same, but memory
    stays bounded however large n_resamples x n is."""
    rows_per_block = max(1, _BLOCK_INDICES // n)
    for start in range(0, n_resamples, rows_per_block):
        yield rng.integers(0, n, size=(min(rows_per_block, n_resamples - start), n))


def _bootstrap_means(columns, groups, n_resamples, rng):
    """Resampled means, shape [n_resamples, n_groups], for each column; rows are resampled within
    each group with the same indices for every column (a paired, stratified bootstrap)."""
    resampled = {name: np.empty((n_resamples, len(groups))) for name in columns}
    for position, rows in enumerate(groups.values()):
        start = 0
        for block in _resample_blocks(len(rows), n_resamples, rng):
            picks, stop = rows[block], start + len(block)
            for name, column in columns.items():
                resampled[name][start:stop, position] = column[picks].mean(axis=1)
            start = stop
    return resampled


def _example_clusters(example_ids, n_rows: int) -> np.ndarray | None:
    """[n_rows] intp: the example index (0 .. n_examples - 1, in order of first appearance) of each row,
    or None without `example_ids`."""
    if example_ids is None:
        return None
    _check_rows("example_ids", example_ids, "example id per row (a string or an int)")
    if len(example_ids) != n_rows:
        raise ValueError(
            f"`example_ids` has {len(example_ids)} entries but there are {n_rows} score rows; give the "
            "example (prompt) id of every row."
        )
    index: dict = {}
    clusters = np.empty(n_rows, dtype=np.intp)
    for row, example in enumerate(example_ids):
        if isinstance(example, bool) or not isinstance(example, (str, numbers.Integral)):
            raise ValueError(
                f"`example_ids[{row}]` is {example!r:.40} ({type(example).__name__}); name every example by "
                "a string or an int (the same id in every setting that ran it)."
            )
        clusters[row] = index.setdefault(example if isinstance(example, str) else int(example), len(index))
    return clusters


def _cluster_bootstrap_means(columns, groups, clusters, n_resamples, rng):
    """Resampled means, shape [n_resamples, n_groups], for each column: each resample draws the
    examples (clusters [n_rows] example index per row) with replacement, once for all groups, and a
    group's mean weights each of its rows by how often its example was drawn (NaN where a group drew
    none of its examples)."""
    n_examples = int(clusters.max()) + 1
    resampled = {name: np.empty((n_resamples, len(groups))) for name in columns}
    start = 0
    for block in _resample_blocks(n_examples, n_resamples, rng):
        offsets = (np.arange(len(block)) * n_examples)[:, None]
        counts = np.bincount((block + offsets).ravel(), minlength=len(block) * n_examples)
        counts = counts.reshape(len(block), n_examples).astype(float)  # [R, n_examples] draws of each example
        stop = start + len(block)
        for position, rows in enumerate(groups.values()):
            weights = counts[:, clusters[rows]]  # [R, rows of the group]
            total = weights.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                for name, column in columns.items():
                    resampled[name][start:stop, position] = weights @ column[rows] / total
        start = stop
    return resampled


def _refuse_references(references: object, name: str) -> None:
    """Refuse `references` (the usual `evaluate` input, which PRR does not have)."""
    if references is not None:
        raise ValueError(
            f"PRR takes no `{name}`: pass the target-only and draft-only models' scores as `target_scores` "
            "and `draft_scores` (one per row, aligned with `predictions`)."
        )


def _resamplable(groups: dict, clusters: np.ndarray | None) -> bool:
    """Whether a bootstrap can vary anything: more than one row in every setting, or, with example ids,
    more than one example in every setting."""
    if clusters is None:
        return all(len(rows) > 1 for rows in groups.values())
    return all(len(np.unique(clusters[rows])) > 1 for rows in groups.values())


def _warn_if_unreliable(result: dict, n_resamples: int) -> None:
    """Warn where the percentile bootstrap's interval cannot be read as a confidence interval: one of zero
    width (every resample gave one value: the examples show no variation to resample, which happens at
    small n near PRR 0 or 1 and does not make the PRR exact), or one resting on a minority of resamples
    (more than `_DROPPED_SHARE` of them dropped as undefined)."""
    flat = [name for name in ("prr_ci", "delta_prr_ci") if result.get(name) and result[name][0] == result[name][1]]
    if flat:
        warnings.warn(
            f"{' and '.join(f'{name} = {result[name]}' for name in flat)} has zero width: every bootstrap resample "
            "gave the same value, because the examples show no variation to resample, not because the PRR is "
            "exact (near PRR 0 or 1 with few examples the percentile bootstrap covers the truth far less often "
            "than its level; see the metric card's Limitations); score more examples before reading it as an "
            "interval.",
            RuntimeWarning,
            stacklevel=3,
        )
    dropped = result["ci_undefined_resamples"]
    if dropped > _DROPPED_SHARE * n_resamples:
        outcome = ("so there is no interval" if dropped == n_resamples else
                   "and were dropped: the intervals rest on the rest and are too narrow")
        warnings.warn(
            f"{dropped} of {n_resamples} bootstrap resamples were undefined (the target and draft tied in them, "
            f"or, with example_ids, a setting drew none of its examples), {outcome}; score more examples on "
            "which the target and draft differ (and run every setting on them).",
            RuntimeWarning,
            stacklevel=3,
        )


def _interval(samples, confidence_level):
    """Percentile interval of the finite samples, or None when none are finite."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return None
    tail = (1.0 - confidence_level) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return [float(low), float(high)]


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Prr(evaluate.Metric):
    """Performance recovery ratio of a speculative decoding method between its draft and target."""

    def compute(self, *, references=None, **kwargs):
        """`evaluate`'s `compute`, refusing `references`, which `evaluate` would silently drop, an
        argument it does not take (a misspelled option), naming the ones it takes, and a call without
        inputs when none were added (`_check_inputs_given`)."""
        _refuse_references(references, "references")
        _check_arguments(self, kwargs)
        _check_inputs_given(self, kwargs)
        return super().compute(**kwargs)

    def add_batch(self, *, references=None, **columns):
        """`evaluate`'s `add_batch` (which `compute` calls), refusing a column that is missing or not a
        list of numbers a float64 holds: `evaluate` would read a bare string character by character,
        parse "0.5", and fail without naming the column on None or on 10**400. The checked columns reach
        `evaluate` as plain lists: it reads a column's first entry as column[0], which a pandas Series with
        another index (a filtered DataFrame's column) looks up as a label (KeyError: 0)."""
        _refuse_references(references, "references")
        for name in self._feature_names():
            _check_rows(name, columns.get(name), "score per row")
            _check_numbers(name, columns[name])
        rows = {name: list(columns[name]) for name in self._feature_names()}
        return super().add_batch(**{**columns, **rows})

    def add(self, *, reference=None, **example):
        """`evaluate`'s `add`, refusing `reference` and a score given as text."""
        _refuse_references(reference, "reference")
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
                {
                    "predictions": datasets.Value("float64"),
                    "target_scores": datasets.Value("float64"),
                    "draft_scores": datasets.Value("float64"),
                }
            ),
            reference_urls=["https://huggingface.co/docs/evaluate"],
        )

    def _compute(
        self,
        predictions,
        target_scores,
        draft_scores,
        higher_is_better=True,
        settings=None,
        baseline_predictions=None,
        example_ids=None,
        confidence_level=0.95,
        n_resamples=1000,
        seed=0,
    ):
        columns = {
            "method": _as_float_array("predictions", predictions),
            "target": _as_float_array("target_scores", target_scores),
            "draft": _as_float_array("draft_scores", draft_scores),
        }
        n_rows = len(columns["method"])
        if n_rows == 0:
            raise ValueError(
                "PRR needs at least one score: pass the method, target-only and draft-only scores "
                "(per example, or one aggregate score each)."
            )
        if baseline_predictions is not None:
            columns["baseline"] = _as_float_array("baseline_predictions", baseline_predictions)
            if len(columns["baseline"]) != n_rows:
                raise ValueError(
                    f"`baseline_predictions` has {len(columns['baseline'])} scores but `predictions` "
                    f"has {n_rows}; pair every score with SecureSD with the one without it."
                )
        higher_is_better = _orientation(higher_is_better)
        confidence_level = _confidence_level(confidence_level)
        n_resamples = _resample_count(n_resamples)
        seed = _seed(seed)
        groups = _group_rows(settings, n_rows)
        clusters = _example_clusters(example_ids, n_rows)
        columns, exponents = _rescaled(columns, groups)
        exponent = int(exponents.max())

        means = {
            name: np.array([column[rows].mean() for rows in groups.values()])
            for name, column in columns.items()
        }
        prr_per_setting = _prr(means["method"], means["target"], means["draft"])
        undefined_settings = [key for key, tie in zip(groups, _ties(means["target"], means["draft"])) if tie]
        if undefined_settings:
            warnings.warn(
                "PRR is undefined because the target-only and draft-only scores are equal "
                f"(settings: {undefined_settings}); the result is NaN. Use a benchmark on which "
                "the two models differ.",
                RuntimeWarning,
                stacklevel=2,
            )
        overall = {
            name: _mean_in_units(means[name], exponents, exponent) for name in ("method", "target", "draft")
        }
        oriented_gap = _oriented_gap(overall["target"], overall["draft"], higher_is_better)

        result = {
            "prr": float(prr_per_setting.mean()),
            "undefined": bool(undefined_settings),
            "method_score": _from_units(overall["method"], exponent),
            "target_score": _from_units(overall["target"], exponent),
            "draft_score": _from_units(overall["draft"], exponent),
            "target_gap": _from_units(oriented_gap, exponent),
            "n_examples": n_rows,
        }
        per_setting = {key: {"prr": float(value)} for key, value in zip(groups, prr_per_setting)}
        if "baseline" in columns:
            baseline_per_setting = _prr(means["baseline"], means["target"], means["draft"])
            result["baseline_prr"] = float(baseline_per_setting.mean())
            delta_per_setting = prr_per_setting - baseline_per_setting
            result["delta_prr"] = float(delta_per_setting.mean())
            for key, baseline, delta in zip(groups, baseline_per_setting, delta_per_setting):
                per_setting[key].update(baseline_prr=float(baseline), delta_prr=float(delta))
        result["per_setting"] = per_setting

        result["prr_ci"] = None
        if "baseline" in columns:
            result["delta_prr_ci"] = None
        result["ci_undefined_resamples"] = 0
        if n_resamples and not undefined_settings and _resamplable(groups, clusters):
            rng = np.random.default_rng(seed)
            if clusters is None:
                resampled = _bootstrap_means(columns, groups, n_resamples, rng)
            else:
                resampled = _cluster_bootstrap_means(columns, groups, clusters, n_resamples, rng)
            prr_samples = _prr(resampled["method"], resampled["target"], resampled["draft"])
            result["ci_undefined_resamples"] = int(np.isnan(prr_samples).any(axis=1).sum())
            result["prr_ci"] = _interval(prr_samples.mean(axis=1), confidence_level)
            if "baseline" in columns:
                baseline_samples = _prr(resampled["baseline"], resampled["target"], resampled["draft"])
                delta_samples = (prr_samples - baseline_samples).mean(axis=1)
                result["delta_prr_ci"] = _interval(delta_samples, confidence_level)
            _warn_if_unreliable(result, n_resamples)
        return result
