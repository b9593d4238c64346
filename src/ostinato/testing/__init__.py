"""What tests, dev scripts and benchmarks share: random-weight models in the real shapes
(``random_models``). Not used by the library itself."""
