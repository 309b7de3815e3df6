"""The cache's core: claim, tune, publish, wait for peers, take over, fall back."""

from .cache import TuneCache, Tuner
from .result import Result, Source

__all__ = ["TuneCache", "Result", "Source", "Tuner"]
