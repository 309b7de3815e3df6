"""Dynamo's shape profiles shared through the database: the code state of profile-guided
automatic dynamic shapes (kind ``pgo``; tunecache.inductor.pgo frames it), as signed
artifacts (tunecache.core.signed_artifacts)."""

from __future__ import annotations

from .signed_artifacts import SignedArtifactShare

__all__ = ["ProfileShare", "MAX_PROFILE_BYTES"]

# A profile holds, per compiled frame, each input's sizes and strides (or "dynamic"):
# a few hundred bytes per frame, tens of KB for a large model. 16 MiB is far above any
# real one and bounds what a bad entry can make a reader read or allocate 256 times lower
# than a graph's bound does.
MAX_PROFILE_BYTES = 16 * 2**20


class ProfileShare(SignedArtifactShare):
    """Signed shape profiles in the shared database: Dynamo starts from its defaults
    (every size static until it changes) where a profile is absent or refused. A job
    rewrites the profile it loaded as it learns more (last writer wins)."""

    noun = "shape profile"
    compiler = "Dynamo"
    max_bytes = MAX_PROFILE_BYTES
    max_stored_bytes = MAX_PROFILE_BYTES
    rewritable = True

    def entry_name(self, kind: str, key: str) -> str:
        return f"Dynamo {self.noun} {key[:80]}"
