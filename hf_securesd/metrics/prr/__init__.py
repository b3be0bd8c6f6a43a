"""The `securesd/prr` `evaluate` module: `evaluate.load(hf_securesd.metrics.path("prr"))` offline,
`evaluate.load("securesd/prr")` from the published Space."""
