"""The `securesd/afr` `evaluate` module: `evaluate.load(hf_securesd.metrics.path("afr"))` offline,
`evaluate.load("securesd/afr")` from the published Space."""
