"""hf-securesd: safe lossy speculative decoding for Hugging Face transformers.

```python
import hf_securesd
from hf_securesd import Step

model = hf_securesd.wrap(model)
out = model.generate(**inputs, assistant_model=draft, verifier="mars", secure_schedule=Step(L=1))
```
"""

from . import hub  # hf_securesd.hub.path() / export_repo() after `import hf_securesd`
from .decoding import NonFiniteLogitsError
from .integration import SecureSDGenerateOutput, patch, securesd_generate, unpatch, wrap
from .schedules import Linear, Power, Schedule, Step
from .segments import Segments
from .stats import SpeculativeStats
from .validation import SecureSDConfigError
from .verifiers import FLy, FSD, MARS, VERIFIERS, BiLD, Lossless, LossySD, SpecCascade, Verifier, VLLMFLy

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
