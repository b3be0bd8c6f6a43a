"""HumanEval (Chen et al., 2021): 164 Python functions; pass@1 with one greedy completion each.

Hub: `openai/openai_humaneval` (split `test`). Local: `humaneval/HumanEval.jsonl.gz`.
The model sees the function signature and docstring and is asked for the whole function in a code
block. The solution (the prompt's imports and helpers + the extracted code) runs in
`hf_securesd.bench.sandbox`, and the tests run in a separate trusted process that calls it
(`Sandbox.check`), so a completion cannot forge a pass.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from hf_securesd.bench.data import load_hub, local_file, read_jsonl, too_few, unique_values
from hf_securesd.bench.sandbox import Sandbox
from hf_securesd.bench.scoring import mean
from hf_securesd.bench.tasks import Example, Message, ScoreOptions, Task, TaskScore

HUB_ID = "openai/openai_humaneval"
LOCAL_PATH = "humaneval/HumanEval.jsonl.gz"
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
SIZE = 164  # problems in the benchmark: all are run
INSTRUCTION = ("Complete the following Python function. Reply with the complete function, including "
               "its signature, in a single ```python code block.")

FENCE = "```"
_LANGUAGE = re.compile(r"[ \t]*([\w+-]*)")  # the language label that opens a fence line


def load(data_dir: Path | None, seed: int) -> list[Example]:
    """All 164 problems in their original order (`seed` is unused: nothing is sampled). A source with
    fewer (a local copy cut short), or two problems with one `task_id` (the example id), is refused."""
    if data_dir:
        source: Path | str = local_file(data_dir, LOCAL_PATH)
        rows = read_jsonl(source, FIELDS, unique="task_id")
    else:
        source = f"the Hugging Face Hub dataset {HUB_ID} (test)"
        rows = load_hub(HUB_ID, split="test")
        unique_values(rows, "task_id", source)
    if len(rows) < SIZE:
        raise too_few(source, len(rows), SIZE, "problems")
    return [Example(id=row["task_id"], fields={key: row[key] for key in FIELDS}) for row in rows]


def build_prompt(example: Example) -> list[Message]:
    """One user message: the instruction and the prompt in a code block."""
    code = example.fields["prompt"].strip("\n")
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{code}\n```"}]


def fenced_blocks(response: str) -> list[tuple[str, str]]:
    """(language label, body) of each fenced block, in order, in time linear in the response: a
    fence opens with "```" and a language label (spaces or tabs, then word characters, "+" or "-")
    followed by the rest of its line; the body runs to the next "```" or, unclosed, to the end. A
    "```" with no line break after it opens nothing (and neither does any later one)."""
    blocks = []
    start = response.find(FENCE)
    while start != -1:
        line_end = response.find("\n", start + len(FENCE))
        if line_end == -1:
            break
        language = _LANGUAGE.match(response, start + len(FENCE), line_end)[1]
        close = response.find(FENCE, line_end + 1)
        if close == -1:
            blocks.append((language, response[line_end + 1:]))
            break
        blocks.append((language, response[line_end + 1:close]))
        start = response.find(FENCE, close + len(FENCE))
    return blocks


def extract_code(response: str, entry_point: str) -> str:
    """The code in a response: the first fenced block that defines `entry_point`, else the first
    Python (or unlabelled) block, else the first block (an unclosed fence, as in a truncated
    generation, runs to the end), else the whole response."""
    blocks = [(language.lower(), body) for language, body in fenced_blocks(response)]
    if not blocks:
        return response
    defining = [body for _, body in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", body)]
    python = [body for language, body in blocks if language in ("", "python", "py", "python3")]
    return (defining or python or [blocks[0][1]])[0]


def build_solution(example: Example, response: str) -> str:
    """The solution module. A response that defines the entry point replaces the prompt's stub; one
    that does not is treated as the body that continues the prompt."""
    fields = example.fields
    code = extract_code(response, fields["entry_point"])
    defines = re.search(rf"^def\s+{re.escape(fields['entry_point'])}\s*\(", code, re.MULTILINE)
    return f"{fields['prompt']}\n{code}" if defines else f"{fields['prompt']}{code}"


def score(examples: Sequence[Example], responses: Sequence[str], options: ScoreOptions) -> TaskScore:
    """pass@1: the fraction of solutions whose tests pass (the prompt is trusted code the tests may
    use, e.g. `poly` of HumanEval/32)."""
    sandbox = Sandbox(options.sandbox_limits, isolation=options.isolation)
    cases = [(build_solution(example, response), example.fields["test"], example.fields["entry_point"],
              example.fields["prompt"]) for example, response in zip(examples, responses)]
    results = sandbox.check_many(cases, workers=options.workers, progress=options.progress,
                                 description="humaneval: executing")
    per_example = [1.0 if result.passed else 0.0 for result in results]
    details = [{"status": result.status, "isolation": sandbox.isolation, "output": result.output[-500:]}
               for result in results]
    return TaskScore("humaneval", "pass@1", mean(per_example), per_example, details)


TASKS = (
    Task(name="humaneval", kind="utility", metric="pass@1",
         description="HumanEval, 164 problems, pass@1 in a sandbox",
         load=load, build_prompt=build_prompt, score_fn=score, max_new_tokens=512),
)
