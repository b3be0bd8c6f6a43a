"""The setup lines of report.md: what they say of settings a results directory may leave unrecorded."""

from __future__ import annotations

from hf_securesd.bench.report import _draft_length_text, machine_text


def test_an_unrecorded_draft_length_is_the_servers_not_none() -> None:
    assert _draft_length_text(None) == "draft length chosen by each server"
    assert _draft_length_text(5) == "k = 5 draft tokens per round"


def test_servers_generating_have_no_local_dtype_or_device() -> None:
    text = machine_text({"dtype": None, "device": None, "engine": "openai"})
    assert text.startswith("dtype and device: the servers'") and "None" not in text
