"""Helpers shared by test modules in every folder (importable because setup.cfg puts tests/ on the path)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.sandbox_bwrap import bwrap_problem

# Tests that run generated code under the sandbox's default isolation: skipped, with the reason, where
# bubblewrap cannot run (`apt-get install -y bubblewrap`; CI installs it).
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


def random_prompts(count: int, seed: int, low: int = 0, high: int = 256, min_len: int = 3, max_len: int = 12):
    """`count` prompts [1, L] of byte tokens with lengths in [min_len, max_len]."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
        prompts.append(torch.randint(low, high, (1, length), generator=generator))
    return prompts


def exact_joint(target, prompt: torch.Tensor, vocab: int, new_tokens: int, sampling: dict) -> dict[tuple[int, ...], float]:
    """The target's exact joint distribution of its next `new_tokens` tokens after `prompt` [1, P], under
    `sampling`'s temperature and top-k (every sequence enumerated: vocab ** new_tokens of them)."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(sampling["temperature"]), TopKLogitsWarper(sampling["top_k"])])
    joint = {}
    with torch.no_grad():
        for sequence in itertools.product(range(vocab), repeat=new_tokens):
            probability, ids = 1.0, prompt
            for token in sequence:
                logits = target(ids).logits[:, -1].float()
                probability *= float(warpers(ids, logits).softmax(-1)[0, token])
                ids = torch.cat([ids, torch.tensor([[token]])], dim=-1)
            joint[sequence] = probability
    return joint


def empirical_tv(exact: dict, samples: list[tuple[int, ...]]) -> float:
    """TV between an exact distribution over sequences and the empirical one of `samples`."""
    counts: dict[tuple[int, ...], int] = {}
    for sample in samples:
        counts[sample] = counts.get(sample, 0) + 1
    keys = set(exact) | set(counts)
    return 0.5 * sum(abs(exact.get(key, 0.0) - counts.get(key, 0) / len(samples)) for key in keys)


def noise_floor(exact: dict, samples: int) -> float:
    """99.9th percentile of the TV of `samples` draws from `exact` itself (300 simulated runs)."""
    keys = list(exact)
    probabilities = np.array([exact[key] for key in keys])
    rng = np.random.default_rng(0)
    tvs = [0.5 * np.abs(rng.multinomial(samples, probabilities) / samples - probabilities).sum() for _ in range(300)]
    return float(np.quantile(tvs, 0.999))


def record_cells(store, task_run, plan, finished: dict | None = None, *, speculative_stats: dict | None = None,
                 seconds: float = 1.0, cpu_seconds: float | None = 1.0, new_tokens: int = 6,
                 session: str = "s") -> dict:
    """Finish and record one cell per (configuration, one response per example) of `plan` through the
    runner's own `finish_cell`, as a study would; `speculative_stats` (a SpeculativeStats dict) goes
    with each speculative configuration's responses. Returns the finished cells by name."""
    from hf_securesd.bench.runner import StudySettings, finish_cell

    finished = {} if finished is None else finished
    for config, responses in plan:
        stats = speculative_stats if config.kind == "speculative" else None
        journal = {
            example.id: {"response": response, "seconds": seconds, "cpu_seconds": cpu_seconds,
                         "new_tokens": new_tokens, "session": session, "stats": stats}
            for example, response in zip(task_run.examples, responses, strict=True)
        }
        cell = finish_cell(config, task_run, journal, finished, StudySettings("t", "d"))
        finished[cell["cell"]] = cell
        store.add_run(cell)
    return finished


def jailbreak_study(folder, data_dir, plan) -> ResultsDir:
    """A results directory at `folder` holding one cell per (configuration, responses) of `plan` on the
    first len(responses) jailbreak examples, recorded as a study records them; returns its
    `ResultsDir` (closed)."""
    from hf_securesd.bench.runner import TaskRun
    from hf_securesd.bench.tasks import get_task

    examples = get_task("jailbreak").examples(data_dir=data_dir, limit=len(plan[0][1]))
    store = ResultsDir(folder)
    manifest = {"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}
    store.open(manifest, {"id": "s", "threads": 1})
    record_cells(store, TaskRun(get_task("jailbreak"), examples, ["" for _ in examples], 16), plan)
    store.close()
    return store


def scored_cell(kind: str, config: str, task: str, task_kind: str, scores: list[int], ar: float | None = None,
                replies: list[str] | None = None) -> dict:
    """A recorded cell as `runs.jsonl` holds it, built from per-example 0/1 scores (for report tests)."""
    n = len(scores)
    return {
        "cell": f"{config}|{task}",
        "config": {"kind": kind},
        "config_key": config,
        "task": task,
        "task_kind": task_kind,
        "metric": "accuracy" if task_kind == "utility" else "afr",
        "n": n,
        "max_new_tokens": 256,
        "baseline_id": f"{task}|n={n}",
        "example_ids": [f"{task}-{index}" for index in range(n)],
        "scores": [float(score) for score in scores],
        "responses": replies or [f"{config} reply {index}" for index in range(n)],
        "acceptance_rate": ar,
        "prr": None,
        "prr_ci": None,
    }


def recording_handler(
    respond: Callable[[BaseHTTPRequestHandler, dict], None], refuse_after: int | None = None
) -> tuple[type[BaseHTTPRequestHandler], dict]:
    """A quiet request handler class and its state: each POST's body is read (kept as the handler's
    `body` and appended to state["bodies"]), the request counted in state["requests"] and its headers
    appended to state["headers"], then `respond(handler, state)`
    answers it (HTTP 500 instead once more than `refuse_after` requests came); a client that hangs up
    mid-reply is ignored. The handler's `state["get"]`, when set, answers GET the same way."""
    state: dict = {"requests": 0, "headers": [], "bodies": [], "lock": threading.Lock()}

    class RecordingHandler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            state["headers"].append(dict(self.headers))
            state["get"](self, state)

        def do_POST(self):  # noqa: N802
            self.body = self.rfile.read(int(self.headers["Content-Length"]))
            with state["lock"]:
                state["requests"] += 1
                state["headers"].append(dict(self.headers))
                state["bodies"].append(self.body)
                count = state["requests"]
            if refuse_after is not None and count > refuse_after:
                self.send_error(500)
                return
            try:
                respond(self, state)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args):
            pass

    return RecordingHandler, state


def send_reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    """Answer with `status`, `body` (its Content-Length set) and `headers`."""
    handler.send_response(status)
    for name, value in {"Content-Length": str(len(body)), **headers}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def serve_locally(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    """A threading HTTP server on 127.0.0.1 (a free port) running `handler` in a daemon thread, and its
    /v1 base URL; call `stop_servers` on it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def serve_model_list(servers: list[ThreadingHTTPServer], respond: Callable[[BaseHTTPRequestHandler, dict], None],
                     models: bytes) -> tuple[str, dict]:
    """Start a `recording_handler` server whose POSTs `respond` answers and whose GET answers the model
    list `models` (JSON bytes); it is appended to `servers` (for `stop_servers`). Returns its /v1 URL and
    its state."""
    Handler, state = recording_handler(respond)
    state["get"] = lambda handler, _: send_reply(handler, 200, models)
    server, url = serve_locally(Handler)
    servers.append(server)
    return url, state


def stop_servers(servers: list[ThreadingHTTPServer]) -> None:
    for server in servers:
        server.shutdown()
        server.server_close()


def sharp_random_model(config, seed: int):
    """A randomly initialised causal LM built from `config` with seed `seed`, weights scaled by 3 (sharp
    distributions, so drafts are accepted and rejected alike), EOS off; `generate` pads with id 256."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config.eos_token_id = None
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3.0)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 256
    return model


# `securesd bench` / `calibrate` options of the smallest run: the tiny pair, one GSM8K prompt, two tokens
SMOKE_CLI = ("--profile", "smoke", "--tasks", "gsm8k", "--limit", "1", "--max-new-tokens", "2", "--no-progress")


def cli_refusal(capsys, argv: list[str]) -> str:
    """Run `securesd` with argv, which must be refused: exit 2 and one error line (no traceback), returned."""
    from hf_securesd.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def tiny_results(out, data_dir, schedules: tuple[str, ...]):
    """A results directory at `out` of the tiny pair: jailbreak and gsm8k, three prompts, mars:0.5 under
    each of `schedules` (no report)."""
    from hf_securesd.cli import main

    argv = ["bench", "--profile", "smoke", "--tasks", "jailbreak", "gsm8k", "--limit", "3", "--max-new-tokens",
            "4", "--verifiers", "mars:0.5", "--schedules", *schedules, "--data-dir", str(data_dir), "--out",
            str(out), "--no-progress", "--no-report"]
    assert main(argv) == 0
    return out


def calibration_cell(config, kind: str, prr: float | None, spd: float | None, ar: float = 0.5) -> dict:
    """A recorded cell of a MARS/Step calibration with only what `calibrate.recommend` reads."""
    schedule = config.schedule
    return {
        "cell": f"{config.key}|{kind}",
        "config_key": config.key,
        "config": config.to_dict(),
        "knob_value": None if config.verifier.name == "lossless" else config.verifier.theta,
        "schedule_label": None if schedule is None else f"step(L={schedule.L})",
        "task_kind": kind,
        "prr": prr,
        "spd": spd,
        "acceptance_rate": ar,
    }


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """Run the `securesd` CLI in-process: (exit status, what it wrote to stderr); argparse's usage
    errors exit through SystemExit, whose code is the status."""
    from hf_securesd.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err
