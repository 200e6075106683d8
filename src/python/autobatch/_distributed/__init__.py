"""The distributed jobs sized by autobatch (docs/sharded.md): `find_sharded`, one rank of an FSDP2
job of any world size sized from one process through torch's fake process group, or every rank of
a running job sized beside it; and `find_ddp`, a DistributedDataParallel job sized from inside it.

The modules, by concern (docs/architecture.md): _sharded.py (find_sharded: the ranks to size, one
search per rank), _sharded_result.py (ShardedResult, RankResult, ShardedTable), _layout.py (the
fake process group, the model built and sharded as one rank sees it, FSDP2's shard layout),
_in_job.py (the running job: each rank sizes itself, the ranks agree, one real step verifies;
shared by both jobs), _ddp.py (find_ddp and its JobResult). This file is the subpackage's front
door: the names the rest of the package takes from it.
"""

from __future__ import annotations

from ._ddp import JobResult, find_ddp
from ._sharded import find_sharded
from ._sharded_result import RankResult, ShardedResult, ShardedTable

__all__ = ["JobResult", "RankResult", "ShardedResult", "ShardedTable", "find_ddp", "find_sharded"]
