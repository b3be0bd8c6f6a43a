"""The `securesd/prr` `evaluate` module; load it with `evaluate.load(hf_securesd.metrics.path("prr"))`."""
