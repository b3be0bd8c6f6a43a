"""The `securesd/afr` `evaluate` module; load it with `evaluate.load(hf_securesd.metrics.path("afr"))`."""
