"""The `securesd/flips` `evaluate` module: `evaluate.load(hf_securesd.metrics.path("flips"))` offline,
`evaluate.load("securesd/flips")` from the published Space."""
