"""Storage: SQLAlchemy Core over SQLite or PostgreSQL. Knows nothing of torch."""

from .artifacts import Artifact, ArtifactStore
from .claims import Claim, ClaimStore, Entry, Publication, StepOutcome
from .engine import Database
from .migrate import ensure_schema

__all__ = ["Database", "ClaimStore", "Entry", "Claim", "Publication", "StepOutcome", "Artifact",
           "ArtifactStore", "ensure_schema"]
