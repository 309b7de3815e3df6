"""Compiled graphs shared through the database: Inductor's FX graph and AOTAutograd cache
entries (kinds ``fxgraph`` and ``autograd``; tunecache.inductor.graphs frames them), as
signed artifacts (tunecache.core.signed_artifacts)."""

from __future__ import annotations

from .signed_artifacts import SignedArtifactShare

__all__ = ["GraphShare", "MAX_GRAPH_BYTES"]

# A model's compiled graph with its constants (and the Triton kernels bundled into an FX
# graph entry) is far below it.
MAX_GRAPH_BYTES = 4 * 2**30


class GraphShare(SignedArtifactShare):
    """Signed compiled graphs in the shared database: Inductor compiles a graph whose
    entry is absent or refused."""

    noun = "compiled graph"
    compiler = "Inductor"
    max_bytes = MAX_GRAPH_BYTES
    loads_own = False
