"""SecureSD as a transformers `custom_generate` method: safe lossy speculative decoding.

transformers runs this file for `model.generate(..., custom_generate="<this repo>", trust_remote_code=True)`
(and for every `generate` call of a model whose own repo holds this folder, loaded with
`trust_remote_code=True`). It hands the call to hf-securesd: with `assistant_model=<draft>` and
`verifier=...` the draft's tokens are verified by the relaxed rule mixed with lossless verification by
response position (`secure_schedule`); without them the call is plain transformers decoding.
"""

from hf_securesd.integration import hub_generate


def generate(*args, model, **kwargs):
    """`model.generate(*args, **kwargs)` with `verifier=`, `secure_schedule=` and `num_assistant_tokens=`.

    `model` is keyword-only: transformers passes it by name, and positional inputs (`generate(ids)`)
    then stay positional."""
    return hub_generate(model, *args, **kwargs)
