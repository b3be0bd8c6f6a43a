"""hf-securesd: safe lossy speculative decoding for Hugging Face transformers.

```python
import hf_securesd
from hf_securesd import Step

model = hf_securesd.wrap(model)
out = model.generate(**inputs, assistant_model=draft, verifier="mars", secure_schedule=Step(L=1))
```
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it. They load on first use (PEP 562), so `import hf_securesd`
# and the `securesd` command's help do not wait for torch and transformers to import, and a Ctrl-C while
# they import lands inside the command, which reports it in one line.
_EXPORTS: dict[str, str] = {
    "NonFiniteLogitsError": ".decoding",
    "SecureSDGenerateOutput": ".integration",
    "patch": ".integration",
    "securesd_generate": ".integration",
    "unpatch": ".integration",
    "wrap": ".integration",
    "Linear": ".schedules",
    "Power": ".schedules",
    "Schedule": ".schedules",
    "Step": ".schedules",
    "Segments": ".segments",
    "SpeculativeStats": ".stats",
    "SecureSDConfigError": ".validation",
    "FLy": ".verifiers",
    "FSD": ".verifiers",
    "MARS": ".verifiers",
    "VERIFIERS": ".verifiers",
    "BiLD": ".verifiers",
    "Lossless": ".verifiers",
    "LossySD": ".verifiers",
    "SpecCascade": ".verifiers",
    "Verifier": ".verifiers",
    "VLLMFLy": ".verifiers",
}

if TYPE_CHECKING:
    from . import hub
    from .decoding import NonFiniteLogitsError
    from .integration import SecureSDGenerateOutput, patch, securesd_generate, unpatch, wrap
    from .schedules import Linear, Power, Schedule, Step
    from .segments import Segments
    from .stats import SpeculativeStats
    from .validation import SecureSDConfigError
    from .verifiers import FLy, FSD, MARS, VERIFIERS, BiLD, Lossless, LossySD, SpecCascade, Verifier, VLLMFLy


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (`hf_securesd.hub`, `hf_securesd.verifiers`, ...), imported on first use."""
    module_name = _EXPORTS.get(name)
    if module_name is not None:
        value = getattr(importlib.import_module(module_name, __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise  # the submodule exists; something it imports is missing
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__version__ = "0.1.0"

__all__ = [
    "wrap",
    "patch",
    "unpatch",
    "securesd_generate",
    "Step",
    "Linear",
    "Power",
    "Schedule",
    "Segments",
    "Verifier",
    "VERIFIERS",
    "Lossless",
    "LossySD",
    "BiLD",
    "SpecCascade",
    "FSD",
    "FLy",
    "MARS",
    "VLLMFLy",
    "SpeculativeStats",
    "SecureSDGenerateOutput",
    "SecureSDConfigError",
    "NonFiniteLogitsError",
    "hub",
]
