"""The data flywheel: request logs -> de-identified (Presidio, offline) -> held-out guarded and
deduped (datasketch MinHash LSH) -> verifiable tasks -> versioned Parquet pool snapshots that
`tasks.sources` names as `pool:<dir>@<version>`.

    from honing.flywheel import ingest
    res = ingest("logs/", "pools/prod")          # every built-in evaluation suite guards by default
    # recipe: tasks.sources: [{name: "pool:pools/prod@<res.version>"}]

Presidio (and the transformers it imports) loads only when a Deidentifier is built.
"""

from __future__ import annotations

from honing.flywheel.deid import Deidentifier, RedactionReport
from honing.flywheel.ingest import IngestResult, ingest
from honing.flywheel.pool import PoolSource, preference_pairs

__all__ = ["ingest", "IngestResult", "PoolSource", "preference_pairs", "Deidentifier", "RedactionReport"]
