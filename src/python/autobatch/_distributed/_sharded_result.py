"""What find_sharded returns: a ShardedResult per world size (every sized rank's RankResult, the
ranks each stands for, the answer), and a ShardedTable of several world sizes (docs/sharded.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .._result import Plan, Result

BACKEND_NOT_MEASURED = (
    "the collective backend's own buffers: the fake process group runs no collective. On gloo "
    "they are what it allocates inside each collective's call and on its worker threads "
    "(scripts/bench/fsdp_fidelity.py: 0 to 2.1 MB of a 14 MB rank peak on a small MLP, varying "
    "with the run's timing; 0 on a tiny Llama); on NCCL they are not measured. Keep that room, "
    "or verify on the real job"
)


@dataclass
class RankResult:
    """One sized rank of a ShardedResult.

    Attributes:
        rank (int): the rank sized, 0 to world size - 1.
        ranks_alike (list[int]): the ranks whose shards are alike (the class it stands for).
        parameter_bytes (int): the padded parameter shard FSDP2 allocates, bytes (every rank:
            ceil(d0/N) rows per parameter).
        local_parameter_bytes (int): the bytes of the rows this rank owns (less on the last
            ranks).
        result (Result): find()'s Result for the rank (its trials, plan and memory).

    Examples:
        >>> r = autobatch.find_sharded(build, shard, example, world_size=64)
        >>> [(x.rank, x.parameter_bytes, x.result.safe_micro_batch) for x in r.ranks]
    """

    rank: int
    ranks_alike: List[int]
    parameter_bytes: int
    local_parameter_bytes: int
    result: Result = field(repr=False)


@dataclass
class ShardedResult:
    """What find_sharded measured for one world size.

    `micro_batch`, `max_micro_batch`, `safe_micro_batch` and `plan` are the binding rank's (the
    sized rank with the smallest safe micro-batch): every rank of the job can train with them;
    inside a running job, the micro-batch the ranks agreed on and verified. `str(r)` is a text
    report; `to_dict()` the JSON section "sharded".

    Attributes:
        world_size (int): the job's ranks.
        binding_rank (int): the sized rank with the smallest safe micro-batch (in a job: this
            rank).
        ranks (list[RankResult]): every rank sized.
        layout (list[dict]): the classes of ranks whose shards are alike, largest first:
            {"ranks": [first, last], "count", "local_parameter_bytes"} ([] in a job).
        backend (str): what is not measured (the collective backend's own buffers).
        agreed_micro_batch (int): inside a running job, the micro-batch the ranks agreed on and
            verified by a real step; 0 otherwise.
        agreed_plan (Plan | None): inside a job, the plan for target_batch at it.
        eval (str): find()'s eval= as given: "" (training only), "training-resident" (eval=True)
            or "parameters-only" (eval="only": micro_batch and max_micro_batch are then the
            evaluation batch's, as find()'s Result gives them).

    Examples:
        >>> r = autobatch.find_sharded(build, shard, example, world_size=64, target_batch=1024)
        >>> r.micro_batch, str(r.plan)
        >>> print(r)  # per sized rank: its shard, optimizer state, max and safe micro-batch
    """

    world_size: int
    binding_rank: int
    ranks: List[RankResult]
    layout: list
    backend: str = BACKEND_NOT_MEASURED
    # inside a running job: the micro-batch the ranks agreed on and verified by a real step, and
    # the plan for target_batch at it (this rank's own `result` may allow more)
    agreed_micro_batch: int = 0
    agreed_plan: Optional[Plan] = None
    # find()'s eval= as given: "" (training only), "training-resident" (eval=True: also the
    # evaluation batch beside the training state) or "parameters-only" (eval="only": the
    # evaluation batch alone; micro_batch and max_micro_batch are then the evaluation's, as
    # find()'s Result gives them)
    eval: str = ""

    @property
    def eval_safe_batch(self) -> int:
        """The evaluation batch every sized rank holds (the smallest of their safe evaluation
        batches); 0 without eval=."""
        return min((r.result.eval_safe_batch for r in self.ranks), default=0) if self.eval else 0

    @property
    def eval_max_batch(self) -> int:
        """The raw evaluation maximum of the rank whose safe evaluation batch binds; 0 without
        eval=."""
        if not self.eval or not self.ranks:
            return 0
        return min(
            self.ranks, key=lambda r: (r.result.eval_safe_batch, r.rank)
        ).result.eval_max_batch

    @property
    def result(self) -> Result:
        """find()'s Result for the binding rank (its trials, plan and report)."""
        return next(r.result for r in self.ranks if r.rank == self.binding_rank)

    @property
    def micro_batch(self) -> int:
        """The micro-batch to train with: the agreed one in a job, else the binding rank's safe
        one."""
        return self.agreed_micro_batch or self.result.safe_micro_batch

    @property
    def safe_micro_batch(self) -> int:
        """The same as micro_batch: the agreed micro-batch in a job, else the binding rank's safe
        one (samples)."""
        return self.agreed_micro_batch or self.result.safe_micro_batch

    @property
    def max_micro_batch(self) -> int:
        """The binding rank's largest micro-batch seen to fit (raw, no headroom), samples."""
        return self.result.max_micro_batch

    @property
    def plan(self) -> Optional[Plan]:
        """The plan for target_batch at micro_batch over the world size (None without a
        target)."""
        return self.agreed_plan if self.agreed_micro_batch else self.result.plan

    def to_dict(self) -> dict:
        """The JSON section "sharded" (docs/report.md): plain data.

        Returns:
            dict: world_size, binding_rank, ranks (each: rank, ranks_alike, parameter_bytes,
            local_parameter_bytes, gradient_bytes, optimizer_state_bytes, max_micro_batch,
            safe_micro_batch, trials), layout, backend_buffers; agreed_micro_batch and verified
            in a job; eval with eval=.
        """
        return {
            "world_size": self.world_size,
            "binding_rank": self.binding_rank,
            "ranks": [
                {
                    "rank": r.rank,
                    "ranks_alike": _span(r.ranks_alike),
                    "parameter_bytes": r.parameter_bytes,
                    "local_parameter_bytes": r.local_parameter_bytes,
                    "gradient_bytes": r.result.memory.get("gradient_bytes", 0),
                    "optimizer_state_bytes": r.result.memory.get("optimizer_state_bytes", 0),
                    "max_micro_batch": r.result.max_micro_batch,
                    "safe_micro_batch": r.result.safe_micro_batch,
                    "trials": len(r.result.trials),
                }
                for r in self.ranks
            ],
            "layout": self.layout,
            "backend_buffers": self.backend,
            **(
                {"agreed_micro_batch": self.agreed_micro_batch, "verified": True}
                if self.agreed_micro_batch
                else {}
            ),
            **(
                {
                    "eval": {
                        "state": self.eval,
                        "safe_batch": self.eval_safe_batch,
                        "max_batch": self.eval_max_batch,
                        "ranks": [
                            {
                                "rank": r.rank,
                                "max_batch": r.result.eval_max_batch,
                                "safe_batch": r.result.eval_safe_batch,
                            }
                            for r in self.ranks
                        ],
                    }
                }
                if self.eval
                else {}
            ),
        }

    def __str__(self) -> str:
        """The text report: the world size, the answer, one line per sized rank, the plan."""
        if self.eval == "parameters-only":
            return self._eval_only_text()
        lines = [
            f"sharded (FSDP2, fake process group): world size {self.world_size}, "
            f"micro-batch {self.safe_micro_batch} (max {self.max_micro_batch}), binding "
            f"rank {self.binding_rank}"
        ]
        if self.eval:
            lines.append(
                f"  evaluation batch {self.eval_safe_batch} (max "
                f"{self.eval_max_batch}) beside the training state, on every rank sized"
            )
        if self.agreed_micro_batch:
            lines[0] = (
                f"sharded (FSDP2, in the job): world size {self.world_size}, agreed "
                f"micro-batch {self.agreed_micro_batch}, verified by one real step on "
                f"every rank; this rank ({self.binding_rank}) alone: safe "
                f"{self.result.safe_micro_batch}, max {self.max_micro_batch}"
            )
        for r in self.ranks:
            lines.append(
                f"  rank {r.rank} (as ranks {_text_span(r.ranks_alike)}): parameter "
                f"shard {r.parameter_bytes} bytes ({r.local_parameter_bytes} its own "
                f"rows), optimizer state "
                f"{r.result.memory.get('optimizer_state_bytes', 0)} bytes, max "
                f"{r.result.max_micro_batch}, safe {r.result.safe_micro_batch}, "
                f"{len(r.result.trials)} trials"
            )
        if self.plan is not None:
            lines.append(f"  {self.plan}")
        lines.append(f"  not measured: {self.backend}")
        return "\n".join(lines)

    def _eval_only_text(self):
        """eval="only": every figure is an evaluation batch's (the parameters alone resident)."""
        lines = [
            f"sharded (FSDP2, fake process group): world size {self.world_size}, "
            f"evaluation batch {self.eval_safe_batch} (max {self.eval_max_batch}) with the "
            f"parameters alone resident (eval='only': no training batch sized)"
        ]
        for r in self.ranks:
            lines.append(
                f"  rank {r.rank} (as ranks {_text_span(r.ranks_alike)}): parameter "
                f"shard {r.parameter_bytes} bytes, evaluation max "
                f"{r.result.eval_max_batch}, safe {r.result.eval_safe_batch}, "
                f"{len(r.result.trials)} trials"
            )
        lines.append(f"  not measured: {self.backend}")
        return "\n".join(lines)


@dataclass
class ShardedTable:
    """find_sharded over several world sizes: one ShardedResult per world size.

    Each row is measured (its own fake group and searches), none extrapolated. `str()` is the
    table; `to_dict()` the JSON, which `scripts/plot_report.py table.json table.png` draws.

    Attributes:
        rows (list[ShardedResult]): one per world size, in the order asked.

    Examples:
        >>> table = autobatch.find_sharded(build, shard, example, world_size=[2, 8, 64],
        ...                                optimizer=lambda p: torch.optim.AdamW(p),
        ...                                target_batch=4096)
        >>> print(table)
        >>> table[64].micro_batch
    """

    rows: List[ShardedResult]

    def __getitem__(self, world_size: int) -> ShardedResult:
        """The row of `world_size`.

        Raises:
            KeyError: the table has no row for that world size.
        """
        for r in self.rows:
            if r.world_size == world_size:
                return r
        raise KeyError(
            f"world size {world_size!r}: the table has {[r.world_size for r in self.rows]}"
        )

    def to_dict(self) -> dict:
        """The table as JSON data: {"world_sizes": [...], "rows": [each row's to_dict() with
        max_micro_batch, safe_micro_batch and the JSON report's plans]}."""
        return {
            "world_sizes": [r.world_size for r in self.rows],
            "rows": [
                {
                    **r.to_dict(),
                    "max_micro_batch": r.max_micro_batch,
                    "safe_micro_batch": r.safe_micro_batch,
                    "plan": r.result.raw.get("plans"),
                }
                for r in self.rows
            ],
        }

    def __str__(self) -> str:
        """The table: per world size, the binding rank, its shard and optimizer state, max and
        safe micro-batch, and the plan."""
        head = (
            f"{'world size':>10} {'rank':>5} {'parameter shard':>16} "
            f"{'optimizer state':>16} {'max':>7} {'safe':>7}  plan"
        )
        lines = ["sharded (FSDP2, fake process group), per rank:", head]
        for r in self.rows:
            b = next(x for x in r.ranks if x.rank == r.binding_rank)
            plan = str(r.plan) if r.plan is not None else "-"
            lines.append(
                f"{r.world_size:>10} {r.binding_rank:>5} {b.parameter_bytes:>16,} "
                f"{b.result.memory.get('optimizer_state_bytes', 0):>16,} "
                f"{r.max_micro_batch:>7} {r.safe_micro_batch:>7}  {plan}"
            )
        lines.append(f"not measured: {self.rows[0].backend}" if self.rows else "")
        return "\n".join(lines)


def _span(ranks):
    return [ranks[0], ranks[-1]] if ranks == list(range(ranks[0], ranks[-1] + 1)) else ranks


def _text_span(ranks):
    s = _span(ranks)
    if len(s) == 2 and s[1] - s[0] + 1 == len(ranks):
        return f"{s[0]}-{s[1]}" if s[0] != s[1] else f"{s[0]}"
    return ", ".join(map(str, s))
