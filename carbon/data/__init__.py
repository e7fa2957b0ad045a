"""carbon.data: data-loading helpers whose results depend only on their
arguments (DeterministicSampler), and the small text corpus the demo trains on
(corpus.txt, package data)."""

from carbon.data.sampler import DeterministicSampler

__all__ = ["DeterministicSampler"]
