"""Start `nanospec serve` as a subprocess and read its state over HTTP: what tests, `nanospec bench` and `benchmarks/` share."""
