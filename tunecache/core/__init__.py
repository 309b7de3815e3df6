"""The cache's core: claim, tune, publish, wait for peers, take over, fall back."""

from .cache import TuneCache
from .claimant import Tuner
from .result import Neighbour, Result, Source, Tuned

__all__ = ["TuneCache", "Result", "Source", "Tuner", "Tuned", "Neighbour"]
