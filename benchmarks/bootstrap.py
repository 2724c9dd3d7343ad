"""The median of a sample and its bootstrap 95% interval, shared by the benchmark scripts."""

from __future__ import annotations

import numpy as np


def bootstrap_median(values: list[float], draws: int = 4000, seed: int = 0) -> tuple:
    """(median, low, high): the sample's median and the 2.5th and 97.5th percentiles of the
    medians of ``draws`` resamples."""
    sample = np.array(values)
    medians = np.median(np.random.default_rng(seed).choice(sample, (draws, len(sample))), axis=1)
    return float(np.median(sample)), *np.percentile(medians, [2.5, 97.5]).tolist()
