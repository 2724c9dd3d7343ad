"""Offline vocabulary tools: coverage-latency trimming, FR-Spec token maps, the hybrid prior and its size, answer corpora, candidate-stream replay."""
