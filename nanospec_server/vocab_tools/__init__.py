"""Offline vocabulary tools: coverage-latency trimming, FR-Spec token maps, the hybrid prior, answer corpora."""
