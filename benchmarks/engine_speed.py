"""Which engine is faster for the study: `securesd bench` through `hf`, `vllm` and `openai` (a local
vLLM server started here) on the same prompts, for target alone, lossless and one relaxed verifier.

Per engine and configuration it prints prompts/s (prompts / the cell's generation wall time, from
runs.jsonl: model loading and engine builds excluded) and CPU-seconds per prompt (user + system
time of every process of the run — the bench process and its children, and for `openai` the
server's process tree — sampled from /proc and divided by all prompts of all cells; it includes
model loading and, for `vllm`, the engine builds, but a server's CPU counts only from when it
answers /health, so `openai`'s figure excludes the servers' own loading and builds). `openai` runs its two servers one after the other — the target
alone for the baseline cell, then the pair with the plugin for the request-field cells (naming
itself as the finished baseline) — because two fp32 servers of the real pair do not fit a 24 GB
machine. It also checks that the engines' target-only and lossless
responses agree. Linux only (/proc). An engine that finished in --out is not run again (its figures
are read back), so a run that failed late resumes with the engines still to do.

    python benchmarks/engine_speed.py --target DIR --draft DIR --task jailbreak --limit 4 \\
        --max-new-tokens 16 --batch-size 4 --engines hf vllm openai --out /tmp/engine_speed
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

CONFIGS = ("target", "lossless")
TICKS = os.sysconf("SC_CLK_TCK")


def process_tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds (user + system) of `root` and its descendants now, by pid."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return {pid: times[pid] for pid in tree if pid in times}


class CpuMeter:
    """Samples the CPU seconds of process trees every `interval` s; `total()` sums each pid's last
    sample (a process that ended between samples loses its last interval)."""

    def __init__(self, roots: list[int], interval: float = 0.5) -> None:
        self.roots, self.interval = roots, interval
        self.start = {pid: cpu for root in roots for pid, cpu in process_tree_cpu(root).items()}
        self.last: dict[int, float] = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for root in self.roots:
                self.last.update(process_tree_cpu(root))

    def total(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.last.items())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace, log: Path, speculative: bool) -> tuple[subprocess.Popen, str]:
    """`vllm serve` of the target alone, or of the pair with the plugin and per-request metrics,
    once /health answers."""
    import httpx

    port = free_port()
    command = [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.target,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(args.max_model_len),
        "--dtype",
        "float32",
        "--seed",
        "0",
        *(["--enforce-eager"] if args.enforce_eager else []),
    ]
    if speculative:
        config = {
            "method": "draft_model",
            "model": args.draft,
            "num_speculative_tokens": args.k,
            "draft_sample_method": "probabilistic",
        }
        command += [
            "--speculative-config",
            json.dumps(config),
            "--enable-per-request-metrics",
            "--per-request-spec-decode-metrics",
            "detailed",
        ]
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command, env={**os.environ, "SECURESD_VLLM": "1"}, stdout=handle, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.server_start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return process, f"{base}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(2)
    process.kill()
    raise RuntimeError(f"vllm serve did not start in {args.server_start_timeout} s; see {log}")


def bench_command(args: argparse.Namespace, engine: str, out: Path, urls: dict[str, str]) -> list[str]:
    python = sys.executable if engine == "hf" else args.vllm_python
    command = [
        python,
        "-m",
        "hf_securesd.cli",
        "bench",
        "--engine",
        engine,
        "--tasks",
        args.task,
        "--limit",
        str(args.limit),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--batch-size",
        str(args.batch_size),
        "--num-assistant-tokens",
        str(args.k),
        "--dtype",
        "fp32",
        "--no-progress",
        "--no-report",
        "--out",
        str(out),
        "--verifiers",
        "lossless",
        args.relaxed,
        "--schedules",
        args.schedule,
    ]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    if engine == "openai":
        # one server at a time (two fp32 servers do not fit a 24 GB machine): the target-alone
        # server runs the baseline cell; then the pair's server runs the request-field cells, with
        # itself named as the (already finished) baseline
        server = urls.get("speculative") or urls["target"]
        command = command[: command.index("--verifiers")] if "speculative" not in urls else command
        return command + [
            *(["--base-url", server] if "speculative" in urls else []),
            "--endpoint",
            f"twin={server}",
            "--baseline",
            "twin",
            "--tokenizer",
            args.target,
            "--token-ids",
            "--concurrency",
            str(args.batch_size),
        ]
    command += ["--target", args.target, "--draft", args.draft]
    if engine == "vllm":
        command += ["--vllm-option", f"max_model_len={args.max_model_len}"]
        if args.enforce_eager:
            command += ["--vllm-option", "enforce_eager=true"]
    return command


def run_engine(args: argparse.Namespace, engine: str) -> dict[str, object]:
    out = Path(args.out) / engine
    finished = out / "engine_speed.json"  # a finished engine's figures: a rerun reuses them
    if finished.is_file():
        return json.loads(finished.read_text())
    cpu = 0.0
    # openai: the target alone (the baseline), then the pair with the plugin, one server at a time
    for role in ("target", "speculative") if engine == "openai" else (None,):
        server, urls = None, {}
        try:
            if role is not None:
                server, urls[role] = start_server(
                    args, Path(args.out) / f"vllm_serve_{role}.log", speculative=role == "speculative"
                )
            process = subprocess.Popen(
                bench_command(args, engine, out, urls), env={**os.environ, "HF_HUB_OFFLINE": "1"}
            )
            meter = CpuMeter([process.pid, *([server.pid] if server else [])])
            code = process.wait()
            cpu += meter.total()
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=60)
        if code != 0:
            raise RuntimeError(f"securesd bench --engine {engine} exited with {code}")
    runs = {}
    for line in (out / "runs.jsonl").read_text().splitlines():
        run = json.loads(line)
        runs[run["config_key"]] = run
    prompts = sum(run["n"] for run in runs.values())
    result = {"runs": runs, "cpu_per_prompt": cpu / prompts}
    finished.write_text(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="target model folder")
    parser.add_argument("--draft", required=True, help="draft model folder")
    parser.add_argument("--task", default="jailbreak")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--k", type=int, default=5, help="draft tokens per round")
    parser.add_argument("--relaxed", default="mars:0.5", help="the relaxed verifier")
    parser.add_argument("--schedule", default="none")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm", "openai"])
    parser.add_argument(
        "--vllm-python",
        default="/tmp/vllmvenv/bin/python",
        help="python of the vLLM environment (.ci/vllm.sh)",
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--server-start-timeout", type=float, default=900)
    parser.add_argument("--data-dir", default=os.environ.get("SECURESD_DATA_DIR"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = {engine: run_engine(args, engine) for engine in args.engines}
    keys = list(next(iter(results.values()))["runs"])
    print(
        f"task {args.task}, {args.limit} prompts, {args.max_new_tokens} new tokens, batch {args.batch_size}, "
        f"k={args.k}, threads: the engines' defaults"
    )
    print(f"{'engine':<8}{'configuration':<34}{'prompts/s':>10}{'AR':>7}{'CPU s/prompt (whole run)':>26}")
    for engine, result in results.items():
        for key in keys:
            run = result["runs"].get(key)
            if run is None:  # the openai engine has no draft-alone endpoint here
                continue
            ar = run.get("acceptance_rate")
            print(
                f"{engine:<8}{key:<34}{run['n'] / run['wall_time']:>10.3f}"
                f"{'–' if ar is None else format(ar, '.3f'):>7}{result['cpu_per_prompt']:>26.2f}"
            )
    reference = next(iter(results.values()))["runs"]
    for engine, result in results.items():
        same = [key for key in CONFIGS if result["runs"][key]["responses"] == reference[key]["responses"]]
        print(
            f"{engine}: responses equal to {args.engines[0]}'s for {', '.join(same) or 'none'} of "
            f"{', '.join(CONFIGS)}"
        )
    (Path(args.out) / "engine_speed.json").write_text(
        json.dumps(
            {
                engine: {
                    key: {
                        "prompts_per_s": run["n"] / run["wall_time"],
                        "acceptance_rate": run.get("acceptance_rate"),
                    }
                    for key, run in result["runs"].items()
                }
                | {"cpu_per_prompt": result["cpu_per_prompt"]}
                for engine, result in results.items()
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
