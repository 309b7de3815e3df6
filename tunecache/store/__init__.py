"""Storage: SQLAlchemy Core over SQLite or PostgreSQL. Knows nothing of torch."""

from .artifacts import Artifact, ArtifactStore
from .engine import Database
from .migrate import ensure_schema
from .store import Claim, Entry, Publication, StepOutcome, Store

__all__ = ["Database", "Store", "Entry", "Claim", "Publication", "StepOutcome", "Artifact",
           "ArtifactStore", "ensure_schema"]
