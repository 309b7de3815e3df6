"""What the operators of a shared cache run: stats, prune, export/import/merge, ls/show,
upgrade, doctor; the library functions behind the ``tunecache`` subcommands.

They are safe while jobs run: every transaction is short (a page of a listing, a batch of
a prune or an import), and a claim whose lease has not passed is never deleted or
overwritten. Importing this package imports SQLAlchemy: the CLI imports it inside its
commands, so that ``tunecache --help`` starts without it.
"""

from ..store.artifact_queries import GraphFilter
from ..store.artifact_rows import ARTIFACT_KINDS
from ..store.entry_filter import EntryFilter
from .browse import ShownEntry, ls, ls_graphs, show
from .doctor import Check, run_checks
from .duration import DURATION_HELP, parse_duration
from .exchange import (
    CONFLICT_POLICIES,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    ExportReport,
    export,
    parse_export,
)
from .importing import ImportReport, import_file, import_records, merge
from .opening import UpgradeReport, open_database, open_source, opened, upgrade
from .pruning import PruneReport, PruneSpec, prune, prune_graphs
from .size import SIZE_HELP, parse_size
from .statistics import GraphStats, StatsReport, graph_stats, stats

__all__ = [
    "ARTIFACT_KINDS",
    "EntryFilter",
    "GraphFilter",
    "open_database",
    "opened",
    "open_source",
    "UpgradeReport",
    "upgrade",
    "parse_duration",
    "DURATION_HELP",
    "StatsReport",
    "stats",
    "GraphStats",
    "graph_stats",
    "parse_size",
    "SIZE_HELP",
    "PruneSpec",
    "PruneReport",
    "prune",
    "prune_graphs",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "CONFLICT_POLICIES",
    "ExportReport",
    "export",
    "parse_export",
    "ImportReport",
    "import_records",
    "import_file",
    "merge",
    "ls",
    "ls_graphs",
    "ShownEntry",
    "show",
    "Check",
    "run_checks",
]
