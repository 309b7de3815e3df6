"""The signals that stop or skip a fusion measurement of a split-size search, and how a
claim given back because of one is recorded."""

from __future__ import annotations

from ..state import REGISTRY

__all__ = ["PeerMeasuring", "NoLongerWanted", "released_as", "stop_unless_wanted"]


class PeerMeasuring(Exception):
    """A peer is running this fusion benchmark: raised to :func:`splitting_single_field`,
    which leaves that candidate to the peer and comes back to it later."""


class NoLongerWanted(BaseException):
    """Stops a split-size value measured ahead once the search is known not to ask for it
    (:func:`splitting_single_field`). A BaseException: Inductor turns an Exception
    inside a benchmarked module, or a coordinate-descent step, into an inf timing."""


def released_as(error: BaseException | str) -> tuple[str, bool]:
    """(error text, whether the attempt failed) for giving back a claim because of
    ``error``: a measurement stopped as no longer wanted is not a failed attempt (a key
    with too many of those would end ``failed``, and every rank then measures it alone)."""
    if isinstance(error, str):
        return error, True
    return f"{type(error).__name__}: {error}", not isinstance(error, NoLongerWanted)


def stop_unless_wanted() -> None:
    wanted = getattr(REGISTRY.fusion_local, "wanted", None)
    if wanted is not None and not wanted():
        raise NoLongerWanted
