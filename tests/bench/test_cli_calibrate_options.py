"""`securesd calibrate` options and outputs that used to surprise: a repeated list option (--L, --verifier,
--tasks, --segment-boundary) kept only its last occurrence, so validation never saw the earlier values;
a verifier that cannot work with the draft length was refused only after three kinds of cells were
generated; calibration.json and calibration.md were written one after the other (a failure between them
left a mismatched pair, a failure at all a traceback after the whole study); a rerun replaced them without
a word; and Ctrl-C was a traceback (now `interrupted`, exit 130, and the same command resumes)."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

import pytest
from support import SMOKE_CLI, cli_refusal

from hf_securesd.bench import cli_bench, cli_calibrate
from hf_securesd.bench.engines.base import GenerationFailure
from hf_securesd.bench.engines.hf import HFEngine
from hf_securesd.cli import EXIT_INTERRUPTED, main


def parse(configure, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(["--out", "o", *argv])


def test_every_occurrence_of_a_list_option_is_kept() -> None:
    args = parse(cli_calibrate.configure, "--L", "1", "--L", "2", "4", "--verifier", "mars:0.5", "--verifier",
                 "fly:0.5", "--tasks", "gsm8k", "--tasks", "jailbreak", "--segment-boundary", "a",
                 "--segment-boundary", "b")
    assert args.lengths == [1, 2, 4] and args.verifier == ["mars:0.5", "fly:0.5"]
    assert args.tasks == ["gsm8k", "jailbreak"] and args.segment_boundary == ["a", "b"]


def test_defaults_are_replaced_not_extended() -> None:
    default = parse(cli_calibrate.configure)
    assert default.lengths == [1, 2, 4, 8, 12] and default.verifier == ["mars:0.5"] and default.tasks is None
    given = parse(cli_calibrate.configure, "--L", "2", "--verifier", "fly:0.5")
    assert given.lengths == [2] and given.verifier == ["fly:0.5"]
    assert parse(cli_calibrate.configure).lengths == [1, 2, 4, 8, 12]  # the default list is not changed


def test_bench_keeps_every_tasks_occurrence_too() -> None:
    assert parse(cli_bench.configure, "--tasks", "gsm8k", "--tasks", "jailbreak").tasks == ["gsm8k", "jailbreak"]
    both = parse(cli_bench.configure, "--verifiers", "mars", "--verifiers", "fly:0.5", "--schedules", "none",
                 "--schedules", "step:1", "step:2")
    assert both.verifiers == ["mars", "fly:0.5"] and both.schedules == ["none", "step:1", "step:2"]


def test_rescore_keeps_every_tasks_occurrence() -> None:
    from hf_securesd.bench import rescore

    parser = argparse.ArgumentParser()
    rescore.configure(parser)
    args = parser.parse_args(["results", "--tasks", "gsm8k", "--tasks", "jailbreak"])
    assert args.tasks == ["gsm8k", "jailbreak"]


@pytest.mark.parametrize("options, message", [
    (["--L", "0", "--L", "1"], "--L 0: Step(L=0) verifies no token losslessly"),
    (["--L", "1", "--verifier", "mars", "--verifier", "fly:0.5"], "--verifier 'mars' names no setting"),
    (["--L", "1", "--L", "1"], "--L names the same setting twice"),
    (["--L", "1", "--tasks", "gsm8k", "--tasks", "gsm8k"], "--tasks names the same setting twice"),
])
def test_validation_sees_the_values_of_every_occurrence(capsys, tmp_path, data_dir, options, message) -> None:
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, *options, "--data-dir", str(data_dir), "--out", str(out)])
    assert message in error and not out.exists()


def test_a_verifier_that_cannot_work_with_the_draft_length_is_refused_before_loading(
        capsys, tmp_path, data_dir, monkeypatch) -> None:
    def loads(args):
        raise AssertionError("models were loaded before the refusal")

    monkeypatch.setattr(cli_calibrate, "prepare", loads)
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--L", "1", "--verifier", "fly:0.5",
                                 "--num-assistant-tokens", "1", "--data-dir", str(data_dir), "--out", str(out)])
    assert "--verifier fly(tau=0.5) with --num-assistant-tokens 1: FLy needs at least 2 drafted tokens" in error
    assert not out.exists()


def test_the_two_files_are_written_together_or_not_at_all(tmp_path) -> None:
    """The second rename fails (a folder holds its name): the first file keeps its earlier text."""
    first, second = tmp_path / "calibration.json", tmp_path / "calibration.md"
    first.write_text("old json")
    (second / "in-the-way").mkdir(parents=True)
    with pytest.raises(OSError) as caught:
        cli_calibrate.write_together({first: "new json", second: "new md"})
    assert str(second) in (caught.value.filename, caught.value.filename2)
    assert first.read_text() == "old json" and sorted(path.name for path in tmp_path.iterdir()) == [
        "calibration.json", "calibration.md"]  # no temporary file is left behind


def calibrate(out: Path, data_dir) -> list[str]:
    return ["calibrate", *SMOKE_CLI, "--L", "1", "--data-dir", str(data_dir), "--out", str(out)]


def test_a_rerun_says_it_replaced_the_files_and_a_failed_write_is_one_line_keeping_the_pair(
        capsys, tmp_path, data_dir, monkeypatch) -> None:
    out = tmp_path / "out"
    assert main(calibrate(out, data_dir)) == 0
    written = f"calibration: {out / 'calibration.json'}, {out / 'calibration.md'}"
    assert capsys.readouterr().out.splitlines()[-1] == written
    assert main(calibrate(out, data_dir)) == 0
    assert capsys.readouterr().out.rstrip().endswith("(replaced an earlier calibration's)")
    before = {name: (out / name).read_text() for name in cli_calibrate.CALIBRATION_FILES}
    (out / "calibration.json").write_text("earlier json")
    replacing = cli_calibrate.replacing

    def full_disk(path: Path):
        if path.name == "calibration.md":
            raise OSError(errno.ENOSPC, "No space left on device")
        return replacing(path)

    monkeypatch.setattr(cli_calibrate, "replacing", full_disk)
    assert main(calibrate(out, data_dir)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {out / 'calibration.md'}: No space left on device")
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert (out / "calibration.json").read_text() == "earlier json"
    assert (out / "calibration.md").read_text() == before["calibration.md"]


def test_ctrl_c_is_one_line_and_the_same_command_resumes(capsys, tmp_path, data_dir, monkeypatch) -> None:
    out = tmp_path / "out"
    generate = HFEngine.generate
    journal = out / "generations.jsonl"

    def interrupted_after_two_cells(self, *args, **kwargs):
        if journal.exists() and len(journal.read_text().splitlines()) == 2:
            raise KeyboardInterrupt
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", interrupted_after_two_cells)
    assert main(calibrate(out, data_dir)) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.splitlines()[-1] == "interrupted"
    assert len(journal.read_text().splitlines()) == 2 and not (out / "calibration.json").exists()
    monkeypatch.setattr(HFEngine, "generate", generate)
    assert main(calibrate(out, data_dir)) == 0
    # target, draft, lossless, mars and mars+Step(L=1): one prompt each, the two journaled not generated again
    assert len(journal.read_text().splitlines()) == 5
    assert (out / "calibration.json").is_file()


def test_prompts_without_an_answer_write_no_calibration_and_the_same_command_completes_it(
        capsys, tmp_path, data_dir, monkeypatch) -> None:
    """A Step(L=1) cell whose prompt got no answer is not recorded: a calibration written without it would
    recommend from the other cells as if L=1 had been weighed. Exit 1, the failure named, no files; the
    same command then retries the prompt and writes the calibration."""
    out = tmp_path / "out"
    generate = HFEngine.generate

    def the_step_cell_fails(self, config, prompts, *args, **kwargs):
        if config.schedule is not None:
            return [GenerationFailure("the server went away") for _ in prompts]
        return generate(self, config, prompts, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", the_step_cell_fails)
    assert main(calibrate(out, data_dir)) == 1
    err = capsys.readouterr().err
    assert "1 prompts got no answer" in err and "the server went away" in err
    assert "No calibration was written: it needs every cell of the sweep." in err and "Traceback" not in err
    assert not (out / "calibration.json").exists() and not (out / "calibration.md").exists()
    monkeypatch.setattr(HFEngine, "generate", generate)
    assert main(calibrate(out, data_dir)) == 0
    assert (out / "calibration.json").is_file() and (out / "calibration.md").is_file()
