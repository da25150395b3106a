"""Prometheus metrics of the queue service (docs/architecture.md#metrics), on the app's registry."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from common.contracts import JobStatus, QueueState
from common.metrics import OTHER, BoundedLabel, nameable

if TYPE_CHECKING:
    from services.queue.history import Maintenance

from services.queue.readings import (
    DEPTH_STATUSES,
    LIVE_STATUSES,
    WAITING_COUNTED,
    DatabaseHealth,
    DepthRow,
    LimitReading,
)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_END_TO_END_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100)

OUTCOMES = ("success", "retry", "dead_letter", "cancelled")
"""Values of `jobq_processed`'s outcome label."""
RELEASE_REASONS = ("shutdown", "requested", "client_gone")
"""Values of `jobq_released`'s reason label."""


class QueueMetrics:
    """Every queue-service metric; one instance per app, registered on `registry`."""

    def __init__(
        self, registry: CollectorRegistry, label_limit: int = 100, depth_cache: bool = True
    ) -> None:
        """`label_limit` bounds each label's values (docs/architecture.md#metrics): the depth
        gauges give that many queues series of their own, ranked afresh at each refresh; the
        counters' queue label takes that many first come plus as many more admitted from the
        depth ranking, and their task type and tenant labels that many first come.
        `depth_cache` says whether a Redis depth cache is configured; without one the
        cache-write gauge is not exported, so its staleness alert cannot fire."""
        self.registry = registry
        self._label_limit = label_limit
        self._depth_queues: set[str] = set()
        """Queue labels of the depth series exported now ("other" included)."""
        self.queue_label = BoundedLabel(label_limit, reserve=label_limit)
        self.task_label = BoundedLabel(label_limit)
        self.tenant_label = BoundedLabel(label_limit)
        self._seeded_queues: set[str] = set()
        self._seeded_pairs: set[tuple[str, str]] = set()
        self.jobs = Gauge(
            "jobq_jobs",
            "Jobs per queue and status, from the database.",
            ["queue", "status"],
            registry=registry,
        )
        self.oldest_pending_age = Gauge(
            "jobq_oldest_pending_age_seconds",
            "Age of the oldest PENDING job, from the database.",
            ["queue"],
            registry=registry,
        )
        self.enqueued = Counter(
            "jobq_enqueued",
            "Jobs created, by the tenant that owns them.",
            ["queue", "task_type", "tenant"],
            registry=registry,
        )
        self.claimed = Counter(
            "jobq_claimed",
            "Jobs handed out to workers, by the tenant that owns them (counted with each depth "
            "refresh): each tenant's share of the claims (docs/architecture.md#fair-shares).",
            ["queue", "tenant"],
            registry=registry,
        )
        self.processed = Counter(
            "jobq_processed",
            "Settled attempts by outcome (success|retry|dead_letter|cancelled).",
            ["queue", "task_type", "outcome"],
            registry=registry,
        )
        self.schedule_clock_stepped_back = Counter(
            "jobq_schedule_clock_stepped_back",
            "Recurring schedules rewound because their stored bucket was more than one period "
            "ahead of the database's clock (the clock was stepped back), by schedule name "
            "(bounded: names come from QUEUE_SCHEDULES).",
            ["schedule"],
            registry=registry,
        )
        self.paused = Gauge(
            "jobq_queue_paused",
            "1 while the queue is paused (POST /queues/{queue}/pause), 0 once resumed; a series "
            "for each queue that was ever paused (paused ones first, at most the label limit).",
            ["queue"],
            registry=registry,
        )
        self._paused_queues: set[str] = set()
        self.concurrency_limit = Gauge(
            "jobq_concurrency_limit",
            "The concurrency limit of a (queue, task type) (PUT /queues/{queue}/limits): jobs "
            "of it that may run at once in all; NaN when only a per-tenant bound is set.",
            ["queue", "task_type"],
            registry=registry,
        )
        self.concurrency_in_use = Gauge(
            "jobq_concurrency_in_use",
            "PROCESSING jobs of a limited (queue, task type), across every worker: the slots "
            "of its limit in use.",
            ["queue", "task_type"],
            registry=registry,
        )
        self.concurrency_waiting = Gauge(
            "jobq_concurrency_waiting",
            "PENDING jobs of a limited (queue, task type): jobs its limit may be holding back "
            f"(at most {WAITING_COUNTED:,} counted).",
            ["queue", "task_type"],
            registry=registry,
        )
        self.rate_tokens = Gauge(
            "jobq_rate_limit_tokens",
            "Tokens in the bucket of a rate-limited (queue, task type) (`rate` of PUT "
            "/queues/{queue}/limits): jobs it may hand out at once now; 0 while its rate holds "
            "jobs back. Refilled at the rate up to the burst.",
            ["queue", "task_type"],
            registry=registry,
        )
        self.claims_held_back = Counter(
            "jobq_claims_held_back",
            "Claims of a limited (queue, task type) that handed out fewer of its jobs than "
            "asked while more waited, by the bound that held them back: concurrency, rate, "
            "tenant (tenantConcurrency or tenantRate).",
            ["queue", "task_type", "reason"],
            registry=registry,
        )
        self._limited_pairs: set[tuple[str, str]] = set()
        self._rated_pairs: set[tuple[str, str]] = set()
        self.lease_expired = Counter(
            "jobq_lease_expired", "Leases the reaper found expired.", ["queue"], registry=registry
        )
        self.hot_vacuum = Histogram(
            "jobq_hot_vacuum_duration_seconds",
            "Vacuums of the live table `job` this replica started because it held "
            "QUEUE_VACUUM_DEAD_ROWS dead rows or more, one observation each (one that found "
            "another vacuum at work on the table skipped it at once).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.hot_reindex = Histogram(
            "jobq_hot_reindex_duration_seconds",
            "Rebuilds of the live table's indexes (REINDEX TABLE CONCURRENTLY) this replica ran "
            "after a pinned horizon had grown them (services/queue/background.py, HotVacuum).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.history_partitions = Counter(
            "jobq_history_partitions",
            "Partitions of the history (`job_history`) this replica's retention pass created or "
            "dropped, whoever manages them (QUEUE_PARTITION_MANAGER).",
            ["action"],
            registry=registry,
        )
        for action in ("created", "dropped"):
            self.history_partitions.labels(action)
        self.history_failures = Counter(
            "jobq_history_maintenance_failures",
            "Steps of this replica's retention pass that failed (a partition not made or not "
            "dropped, a tree pg_partman could not register or maintain); each is tried again "
            "at the next pass.",
            registry=registry,
        )
        self.history_default_deleted = Counter(
            "jobq_history_default_rows_deleted",
            "Rows past retention deleted one by one from the history's DEFAULT partitions: "
            "settles that found no partition for their day (the retention pass stopped for "
            "longer than the partitions made ahead). Zero while the pass runs.",
            registry=registry,
        )
        self.history_swept = Counter(
            "jobq_history_rows_swept",
            "Finished rows a release before the history left in `job`, moved into it by the "
            "sweep (a rollout only).",
            registry=registry,
        )
        self.history_pass = Histogram(
            "jobq_history_pass_duration_seconds",
            "This replica's retention passes (partitions made and dropped, DEFAULT rows purged, "
            "the sweep, expired idempotency keys deleted), one observation each: retention's "
            "cost in time.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.history_maintained = Gauge(
            "jobq_history_maintained_timestamp_seconds",
            "Unix time of this replica's last retention pass in which no step failed.",
            registry=registry,
        )
        self.claim_duration = Histogram(
            "jobq_claim_duration_seconds",
            "Time of one claim statement (pool checkout, statement, commit); a long poll "
            "observes each of its re-checks, never its wait.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.claim_batch_size = Histogram(
            "jobq_claim_batch_size",
            "Jobs handed out per non-empty claim.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.empty_claims = Counter(
            "jobq_empty_claims",
            "Claims that returned no job (after any long poll).",
            registry=registry,
        )
        self.end_to_end = Histogram(
            "jobq_end_to_end_seconds",
            "Submit to COMPLETED, per queue and task type.",
            ["queue", "task_type"],
            buckets=_END_TO_END_BUCKETS,
            registry=registry,
        )

        self.released = Counter(
            "jobq_released",
            "Jobs released back to the queue before they finished, by reason (shutdown: the "
            "worker stopped; requested: a release without a reason; client_gone: claimed for a "
            "long poll whose client left).",
            ["queue", "reason"],
            registry=registry,
        )
        self.listener_reconnects = Counter(
            "jobq_listener_reconnects",
            "LISTEN connections replaced, by why the previous one ended "
            "(silent: its probe did not come back; closed; error: connecting or LISTEN failed).",
            ["reason"],
            registry=registry,
        )

        self.oldest_transaction_age = Gauge(
            "jobq_db_oldest_transaction_age_seconds",
            "Age of the oldest open transaction holding a snapshot in the queue's database: how "
            "long vacuum has been held back.",
            registry=registry,
        )
        self.live_tuples = Gauge(
            "jobq_db_live_tuples", "Live rows of a table.", ["table"], registry=registry
        )
        self.dead_tuples = Gauge(
            "jobq_db_dead_tuples",
            "Dead rows of a table, waiting for vacuum.",
            ["table"],
            registry=registry,
        )
        self.last_vacuum_age = Gauge(
            "jobq_db_last_vacuum_age_seconds",
            "Seconds since the latest VACUUM or autovacuum of a table (NaN before the first).",
            ["table"],
            registry=registry,
        )
        self.depth_refreshed = Gauge(
            "jobq_depth_refresh_timestamp_seconds",
            "Unix time of the last depth read from PostgreSQL (the jobq_jobs gauges).",
            registry=registry,
        )
        self.depth_cache_written: Gauge | None = None
        if depth_cache:
            self.depth_cache_written = Gauge(
                "jobq_depth_cache_write_timestamp_seconds",
                "Unix time of the last depth snapshot written to the Redis cache.",
                registry=registry,
            )

    def seed_queue(self, queue: str) -> str:
        """Return `queue`'s label (`queue_label`), first creating at 0 every per-queue counter
        series of that label: `jobq_lease_expired` and `jobq_released` for every reason.

        A labelled counter series otherwise appears at its first increment, and `increase()`
        or `rate()` sees no rise in a series' first sample: the first burst of lease expiries
        after a start would leave `JobqLeaseExpiriesSpiking` quiet (issue 25 item 2). Seeding
        makes the series exist at 0 as soon as the queue is known (its first job, its first
        depth reading), before anything counts in it.
        """
        label = self.queue_label(queue)
        self._seed_queue_label(label)
        return label

    def _seed_queue_label(self, label: str) -> None:
        if label not in self._seeded_queues:
            self._seeded_queues.add(label)
            self.lease_expired.labels(label)
            for reason in RELEASE_REASONS:
                self.released.labels(label, reason)

    def seed(self, queue: str, task_type: str) -> tuple[str, str]:
        """Return the (queue, task type) labels of a job, first creating at 0 the queue's
        series (`seed_queue`) and `jobq_processed` for the pair and every outcome, so the
        first retries or dead letters of a pair are a rise the error-ratio alert and the
        dashboard see (issue 25 item 2)."""
        pair = (self.seed_queue(queue), self.task_label(task_type))
        if pair not in self._seeded_pairs:
            self._seeded_pairs.add(pair)
            for outcome in OUTCOMES:
                self.processed.labels(*pair, outcome)
        return pair

    def count_enqueued(self, queue: str, task_type: str, tenant: str, count: int = 1) -> None:
        """Count `count` jobs created in `queue` of `task_type`, owned by `tenant` (seeding the
        pair's other counters, `seed`)."""
        queue_label, task_label = self.seed(queue, task_type)
        self.enqueued.labels(queue_label, task_label, self.tenant_label(tenant)).inc(count)

    def count_claimed(self, counts: dict[tuple[str, str], int]) -> None:
        """Add jobs handed out, `{(queue, tenant): jobs}`, to `jobq_claimed_total`."""
        for (queue, tenant), count in counts.items():
            self.claimed.labels(self.queue_label(queue), self.tenant_label(tenant)).inc(count)

    def observe_maintenance(self, done: Maintenance, seconds: float) -> None:
        """Count what one retention pass (`History.maintain`) did and how long it took
        (`seconds`), and stamp `jobq_history_maintained_timestamp_seconds` when none of its
        steps failed."""
        self.history_pass.observe(seconds)
        self.history_partitions.labels("created").inc(len(done.created))
        self.history_partitions.labels("dropped").inc(len(done.dropped))
        self.history_failures.inc(len(done.failed))
        self.history_default_deleted.inc(done.default_deleted)
        self.history_swept.inc(done.swept)
        if not done.failed:
            self.history_maintained.set_to_current_time()

    def observe_health(self, health: DatabaseHealth) -> None:
        """Publish one reading of the database's health (the `job` table's figures)."""
        self.oldest_transaction_age.set(health.oldest_transaction_age_seconds)
        self.live_tuples.labels("job").set(health.live_tuples)
        self.dead_tuples.labels("job").set(health.dead_tuples)
        age = health.last_vacuum_age_seconds
        self.last_vacuum_age.labels("job").set(math.nan if age is None else age)

    def observe_paused(self, states: list[QueueState]) -> None:
        """Publish which queues are paused in `jobq_queue_paused`: the paused ones first, then
        the resumed ones, `label_limit` series at most; a queue left out loses its series."""
        shown = sorted(states, key=lambda state: (not state.paused, state.queue))
        shown = shown[: self._label_limit]
        for queue in self._paused_queues - {state.queue for state in shown}:
            self.paused.remove(queue)
        for state in shown:
            self.paused.labels(state.queue).set(1 if state.paused else 0)
        self._paused_queues = {state.queue for state in shown}

    def observe_limits(self, readings: list[LimitReading]) -> None:
        """Publish each limited (queue, task type)'s limit, slots in use, jobs waiting and rate
        bucket tokens; a pair whose limit (or rate) was removed loses its series. At most
        `label_limit` pairs (the busiest first)."""
        shown = sorted(readings, key=lambda r: (-r.running, r.queue, r.task_type))
        shown = shown[: self._label_limit]
        pairs = {(reading.queue, reading.task_type) for reading in shown}
        for pair in self._limited_pairs - pairs:
            self.concurrency_limit.remove(*pair)
            self.concurrency_in_use.remove(*pair)
            self.concurrency_waiting.remove(*pair)
        rated = {(r.queue, r.task_type) for r in shown if r.tokens is not None}
        for pair in self._rated_pairs - rated:
            self.rate_tokens.remove(*pair)
        self._rated_pairs = rated
        for reading in shown:
            if reading.tokens is not None:
                self.rate_tokens.labels(reading.queue, reading.task_type).set(reading.tokens)
            limit = math.nan if reading.concurrency is None else reading.concurrency
            self.concurrency_limit.labels(reading.queue, reading.task_type).set(limit)
            self.concurrency_in_use.labels(reading.queue, reading.task_type).set(reading.running)
            self.concurrency_waiting.labels(reading.queue, reading.task_type).set(reading.waiting)
        self._limited_pairs = pairs

    def observe_depth(self, rows: list[DepthRow]) -> None:
        """Publish a fresh depth snapshot in `jobq_jobs` and `jobq_oldest_pending_age_seconds`.

        The `label_limit` queues with the most live jobs (SCHEDULED, PENDING, PROCESSING; ties
        broken by dead letters, then in favour of queues that had series already, then by
        name) get series of their own, one per depth status (0 where it has none); every
        other queue is summed into `queue="other"`, per status, its age the oldest of theirs.
        A queue that empties keeps its series at 0 while it still ranks; a queue pushed out of
        the ranking loses its series (removed, never left stale) and counts in "other" from
        then on. A queue literally named "other", or not matching the name pattern, is always
        summed into "other". The ranked queues are admitted to the counters' queue label,
        and every depth label ("other" included) gets its per-queue counter series at 0
        (`seed_queue`), so a restarted service has the series of the queues already in the
        database before their first lease expires.
        """
        counts: dict[str, dict[JobStatus, int]] = {}
        oldest: dict[str, float] = {}
        for row in rows:
            by_status = counts.setdefault(row.queue, {})
            by_status[row.status] = by_status.get(row.status, 0) + row.count
            if row.status is JobStatus.PENDING:
                oldest[row.queue] = max(oldest.get(row.queue, 0.0), row.oldest_age_seconds)
        for queue in self._depth_queues - {OTHER}:
            counts.setdefault(queue, {})

        def rank(queue: str) -> tuple[int, int, bool, str]:
            by_status = counts[queue]
            live = sum(by_status.get(status, 0) for status in LIVE_STATUSES)
            dead = by_status.get(JobStatus.DEAD_LETTER, 0)
            return (-live, -dead, queue not in self._depth_queues, queue)

        candidates = [q for q in counts if q != OTHER and nameable(q)]
        own = sorted(candidates, key=rank)[: self._label_limit]
        folded = counts.keys() - set(own)
        for queue in own:
            for status in DEPTH_STATUSES:
                self.jobs.labels(queue, status.value).set(counts[queue].get(status, 0))
            self.oldest_pending_age.labels(queue).set(oldest.get(queue, 0.0))
        exported = set(own)
        if folded or OTHER in self._depth_queues:
            exported.add(OTHER)
            for status in DEPTH_STATUSES:
                total = sum(counts[queue].get(status, 0) for queue in folded)
                self.jobs.labels(OTHER, status.value).set(total)
            age = max((oldest.get(queue, 0.0) for queue in folded), default=0.0)
            self.oldest_pending_age.labels(OTHER).set(age)
        for queue in self._depth_queues - exported:
            for status in DEPTH_STATUSES:
                self.jobs.remove(queue, status.value)
            self.oldest_pending_age.remove(queue)
        self._depth_queues = exported
        self.queue_label.admit(own)
        for label in exported:
            self._seed_queue_label(label)
