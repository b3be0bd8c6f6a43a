"""Performance recovery ratio (PRR) and its paired difference (ΔPRR), as an `evaluate` metric.

This file is self-contained (numpy, datasets, evaluate); with its card, app.py and requirements.txt it
is the Hub Space `securesd/prr` (`hf_securesd.metrics.export("prr", folder)` writes exactly those files).
Load it with `evaluate.load("securesd/prr")` once published, or offline with
`evaluate.load(hf_securesd.metrics.path("prr"))`.
"""

import warnings

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
worse than the draft (a sign that the orientation is wrong). When x_target equals x_draft the
ratio is undefined: the metric returns NaN, sets `undefined` and warns, never dividing by zero.

With `settings` (one hyperparameter setting per row) the PRR is computed per setting and averaged
over the sweep. With `baseline_predictions` (the same verifier and setting without SecureSD) it
also reports the paired difference ΔPRR = PRR(with) - PRR(without), averaged over the sweep.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): the method's raw scores, one per example, or a single
        aggregate score (a list of length one).
    target_scores (`list` of `float`): the target-only model's scores, aligned with `predictions`.
    draft_scores (`list` of `float`): the draft-only model's scores, aligned with `predictions`.
    higher_is_better (`bool`, default `True`): orientation of the raw score. Use `False` for
        scores such as attack success rate.
    settings (`list`, optional): the hyperparameter setting of each row (a number, a string, None,
        a tuple...). Rows with equal settings form a group (`1` and `1.0` are one setting, `None`
        and `"None"` two); PRR is computed per group and averaged over the groups. An unhashable
        setting (a list, a dict) is grouped and named by its `repr`; NaN is refused.
    baseline_predictions (`list` of `float`, optional): the paired scores of the method without
        SecureSD (same verifier, setting and example as each row). Enables ΔPRR.
    confidence_level (`float`, default 0.95): level of the bootstrap interval.
    n_resamples (`int`, default 1000): bootstrap resamples; 0 gives no interval.
    seed (`int`, default 0): seed of the bootstrap; equal seeds give equal intervals.

Returns:
    prr (`float`): PRR, averaged over settings; NaN when undefined.
    undefined (`bool`): True when x_target == x_draft for some setting.
    method_score, target_score, draft_score (`float`): mean raw scores, as given (averaged over
        settings).
    target_gap (`float`): x_target - x_draft in the higher-is-better sense; positive when the
        target beats the draft.
    prr_ci (`list` of two `float`, or `None`): bootstrap interval of `prr`; `None` for aggregate
        scores (a setting with a single row), when PRR is undefined and with `n_resamples=0`.
    per_setting (`dict`): keyed by setting (as first given; "all" without `settings`), its PRR
        (and baseline PRR and ΔPRR when given).
    n_examples (`int`): number of rows.
    With `baseline_predictions` also:
    baseline_prr (`float`): PRR without SecureSD, averaged over settings.
    delta_prr (`float`): mean over settings of PRR(with) - PRR(without).
    delta_prr_ci (`list` of two `float`, or `None`): paired bootstrap interval of `delta_prr`.
    ci_undefined_resamples (`int`): bootstrap resamples dropped because x_target == x_draft in them.

Examples:
    Table 3 of the SecureSD paper (Qwen3 jailbreak AFR: target .895, draft .195):

    >>> prr = evaluate.load("securesd/prr")  # offline: evaluate.load(hf_securesd.metrics.path("prr"))
    >>> result = prr.compute(predictions=[0.7158], target_scores=[0.895], draft_scores=[0.195])
    >>> round(result["prr"], 3)
    0.744
"""

_EQUAL_TOLERANCE = 1e-12


def _prr(method, target, draft):
    """Elementwise PRR of mean scores; NaN where the target and draft means coincide."""
    gap = target - draft
    undefined = np.abs(gap) <= _EQUAL_TOLERANCE
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(undefined, np.nan, (method - draft) / np.where(undefined, 1.0, gap))


def _as_float_array(name, values):
    """Validate one column: a non-empty list of finite numbers."""
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be a flat list of numbers, got shape {array.shape}.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` contains NaN or infinite scores; pass finite raw scores only.")
    return array


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
    group, `None` and `"None"` do not), else its `repr`. NaN equals nothing and is refused."""
    try:
        hash(setting)
    except TypeError:
        return _Unhashable(setting)
    if setting != setting:
        raise ValueError(
            f"`settings[{index}]` is NaN, which equals no other setting; name every setting by a value "
            "equal to itself (a number, a string or None)."
        )
    return setting


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
    if len(settings) != n_rows:
        raise ValueError(
            f"`settings` has {len(settings)} entries but there are {n_rows} score rows; "
            "give one setting per row."
        )
    groups = {}
    for index, setting in enumerate(settings):
        groups.setdefault(_group_key(index, setting), []).append(index)
    return {_setting_name(key, groups): np.asarray(rows) for key, rows in groups.items()}


def _resample_count(n_resamples):
    """`n_resamples` as an int; 0 means no bootstrap interval."""
    try:
        count = int(n_resamples)
    except (TypeError, ValueError):
        count = None
    if count is None or isinstance(n_resamples, bool) or count != n_resamples or count < 0:
        raise ValueError(
            f"`n_resamples` must be a whole number >= 0 (0: no bootstrap interval), got {n_resamples!r}."
        )
    return count


def _bootstrap_means(columns, groups, n_resamples, rng):
    """Resampled means, shape [n_resamples, n_groups], for each column; rows are resampled within
    each group with the same indices for every column (a paired, stratified bootstrap)."""
    resampled = {name: np.empty((n_resamples, len(groups))) for name in columns}
    for position, rows in enumerate(groups.values()):
        picks = rows[rng.integers(0, len(rows), size=(n_resamples, len(rows)))]
        for name, column in columns.items():
            resampled[name][:, position] = column[picks].mean(axis=1)
    return resampled


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
        if not 0.0 < confidence_level < 1.0:
            raise ValueError(f"`confidence_level` must lie in (0, 1), got {confidence_level}.")
        n_resamples = _resample_count(n_resamples)
        groups = _group_rows(settings, n_rows)

        means = {
            name: np.array([column[rows].mean() for rows in groups.values()])
            for name, column in columns.items()
        }
        prr_per_setting = _prr(means["method"], means["target"], means["draft"])
        gap_per_setting = means["target"] - means["draft"]
        undefined_settings = [
            key for key, gap in zip(groups, gap_per_setting) if abs(gap) <= _EQUAL_TOLERANCE
        ]
        if undefined_settings:
            warnings.warn(
                "PRR is undefined because the target-only and draft-only scores are equal "
                f"(settings: {undefined_settings}); the result is NaN. Use a benchmark on which "
                "the two models differ.",
                RuntimeWarning,
                stacklevel=2,
            )
        oriented_gap = float(gap_per_setting.mean()) * (1.0 if higher_is_better else -1.0)
        if oriented_gap < -_EQUAL_TOLERANCE:
            warnings.warn(
                "The target-only model scores worse than the draft-only model under "
                f"higher_is_better={higher_is_better}; check the orientation of the scores.",
                UserWarning,
                stacklevel=2,
            )

        result = {
            "prr": float(prr_per_setting.mean()),
            "undefined": bool(undefined_settings),
            "method_score": float(means["method"].mean()),
            "target_score": float(means["target"].mean()),
            "draft_score": float(means["draft"].mean()),
            "target_gap": oriented_gap,
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
        if n_resamples and not undefined_settings and all(len(rows) > 1 for rows in groups.values()):
            rng = np.random.default_rng(seed)
            resampled = _bootstrap_means(columns, groups, n_resamples, rng)
            prr_samples = _prr(resampled["method"], resampled["target"], resampled["draft"])
            result["ci_undefined_resamples"] = int(np.isnan(prr_samples).any(axis=1).sum())
            result["prr_ci"] = _interval(prr_samples.mean(axis=1), confidence_level)
            if "baseline" in columns:
                baseline_samples = _prr(resampled["baseline"], resampled["target"], resampled["draft"])
                delta_samples = (prr_samples - baseline_samples).mean(axis=1)
                result["delta_prr_ci"] = _interval(delta_samples, confidence_level)
        return result
