"""Statistics and live settings: per-request counters, step timings, streams, Prometheus series, the internal-state channel."""
