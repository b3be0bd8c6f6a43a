"""`securesd report`'s ΔPRR / ΔSPD rows: a task's knob settings ran on the same prompts and are resampled
together."""

from __future__ import annotations

import numpy as np
import pytest

from hf_securesd.bench.report import delta_row

N = 40
IDS = [f"p{i}" for i in range(N)]


def _cell(kind: str, scores, seconds, knob=None, schedule=None) -> dict:
    cell = {"cell": f"{kind}-{knob}-{schedule}", "task": "jb", "task_kind": "safety", "baseline_id": "jb|n40",
            "example_ids": IDS, "scores": [float(value) for value in scores], "seconds": list(seconds),
            "details": [], "config": {"kind": kind}, "knob_value": knob, "schedule_label": schedule}
    if kind == "speculative":
        cell["config"]["verifier"] = {"verifier": "mars"}
    return cell


def _row(knobs: int) -> dict:
    """ΔPRR/ΔSPD of `knobs` knob values that all produced the same run (the same scores and times)."""
    rng = np.random.default_rng(5)
    target, draft = (rng.random(N) < 0.9).astype(float), (rng.random(N) < 0.2).astype(float)
    fragile = rng.random(N)
    target_seconds = 1.0 + rng.random(N)
    cells = [_cell("target", target, target_seconds), _cell("draft", draft, np.full(N, 0.3))]
    for knob in range(knobs):
        cells.append(_cell("speculative", np.where(fragile < 0.9, target, draft), np.linspace(0.5, 0.9, N), knob / 10,
                           "step(L=1)"))
        cells.append(_cell("speculative", np.where(fragile < 0.4, target, draft), np.linspace(0.4, 0.6, N) ** 2,
                           knob / 10, None))
    base = {("target", "jb|n40"): cells[0], ("draft", "jb|n40"): cells[1]}
    return delta_row(cells, base, "mars", "step(L=1)", ["jb"], seed=0)


def test_knob_values_on_the_same_prompts_do_not_narrow_the_intervals():
    """Four knob values that gave one and the same run are one measurement: their ΔPRR and ΔSPD intervals are
    the one knob value's (resampling each knob value's prompts apart made them about half as wide)."""
    one, four = _row(1), _row(4)
    assert four["tasks"]["jb"]["delta_prr"] == pytest.approx(one["tasks"]["jb"]["delta_prr"])
    np.testing.assert_allclose(four["tasks"]["jb"]["delta_prr_ci"], one["tasks"]["jb"]["delta_prr_ci"], rtol=1e-9)
    assert four["delta_spd"] == pytest.approx(one["delta_spd"])
    np.testing.assert_allclose(four["delta_spd_ci"], one["delta_spd_ci"], rtol=1e-9)
