"""Replicated buckets on a cluster's tablet server: leading (tracking followers, the in-sync replicas and
the high watermark) and following (fetching the leader's log).

A **follower** fetches from the leader with FetchLog (``follower_server_id`` = its id) from its log end,
appends the batches as they are (offsets, timestamps, writer ids), fsyncs them, and only then fetches
again, so its fetch offset tells the leader what it holds durably. It takes the leader's high watermark
from each answer. A follower keeps no KV state.

The **leader** records each follower's fetch offset. Its high watermark is what every in-sync replica
(ISR) holds; writes are acknowledged (and applied to RocksDB, and visible) only below it, so an
acknowledged write is on every ISR replica's disk. A follower that has not caught up with the leader's log
for ``log.replica.max-lag-time`` leaves the ISR; one that reaches the high watermark rejoins. A follower that sends no fetch for
``log.replica.max-silence-time`` (it died) leaves at once; and the coordinator takes a tablet server whose
registration vanished out of every ISR (:mod:`strom.coordinator.leader_election`). ISR changes go to
the active coordinator (AdjustIsr, :mod:`strom.coordinator.isr_changes`), which writes them by
compare-and-set on the state the leader names (leader epoch, version), *before* the leader acts on them:
a leader replaced while it was paused is refused, cannot shrink the
ISR to itself, so it cannot acknowledge anything alone; it reads the new state and follows. While a write
that adds followers is in flight, the high watermark waits for them too: ZooKeeper may name them already,
and the coordinator elects from what it names (Kafka's "maximal ISR"); after an unanswered write, until a
later one settles it or the follower falls silent. A fetch offset past the leader's log end is refused,
never counted (the follower truncates and fetches again).

Nothing is truncated on a change of role. A new leader keeps its whole log; a follower joins its ISR only
once it holds what the leader's log held when the leadership began (a restarted leader's recorded high
watermark may lag what it acknowledged). A new follower fetches from its recorded high watermark and
compares what it holds above with the leader's batches, giving up its own only from the first that differs
(:meth:`LogTablet.append_from_leader`) or past the leader's durable end. The rule, and why these keep it:
docs/cluster.md, "No acknowledged write is lost".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from strom.errors import LogOffsetOutOfRangeError, NotLeaderOrFollowerError, StromError, error_for_code
from strom.ids import TableBucket
from strom.membership.contract import BucketStates, LeaderAndIsr, ServerRegistry
from strom.metadata.table_info import TableInfo
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from strom.rpc.peers import PeerConnections, ServerNode
from strom.security.internal import tablet_server_name
from strom.tablet.replica import Replica, ReplicaManager
from strom.tablet.tablet_service import OFFSET_EARLIEST, OFFSET_LATEST

log = logging.getLogger(__name__)

RETRY_S = 0.2
ISR_CHECK_S = 0.25
CHECKPOINT_S = 1.0
RECHECK_ROLES_S = 2.0
"""How often each replica's role is checked against ZooKeeper's state (a notice of the coordinator's may be
lost: the coordinator killed between writing a new leader and telling it, the notice cut off)."""
STOP_WAIT_S = 5.0

AdjustIsr = Callable[[TableBucket, LeaderAndIsr, int, tuple[int, ...]], Awaitable[int | None]]
"""Ask the active coordinator to set a led bucket's ISR (state, version, new ISR): the new version once it is
written, None when it refused because the state moved on (or a replica may not join); raises when the outcome
is unknown (no answer)."""


@dataclass
class _Follower:
    fetch_offset: int
    caught_up_ms: float
    fetched_ms: float
    """When it last sent a fetch (or when this leadership began)."""
    told_high_watermark: int = -1
    """The high watermark the last answer to it carried."""


@dataclass
class _Leading:
    replica: Replica
    state: LeaderAndIsr
    version: int
    followers: dict[int, _Follower]
    changing: bool = False
    """An ISR write to ZooKeeper is in flight."""
    joining: tuple[int, ...] = ()
    """Followers that the ISR write in flight adds: ZooKeeper may hold them in the ISR already (the
    coordinator could elect one), so the high watermark waits for them too until the write is settled."""
    epoch_start: int = 0
    """This log's end when this leadership began: a follower joins the ISR only once it holds that much,
    since a recorded high watermark may lag what was committed before (Kafka's leader epoch start offset)."""


@dataclass
class _Following:
    replica: Replica
    leader: int
    leader_epoch: int
    matched: int | None = None
    """While set: only the log below it is known to equal the leader's (it is fetched from there and
    compared); None once the whole log does."""
    task: asyncio.Task[None] | None = None
    stopped: bool = False
    """Set before its fetch task is cancelled: the task touches the log no more even if a cancellation is
    lost on the way (one that arrives as an awaited call completes can be swallowed by library code)."""
    leader_high_watermark: int = 0
    errors: int = field(default=0)

    def fetch_offset(self) -> int:
        """Where to fetch from: what this replica surely holds as the leader does (what it claims to hold)."""
        end = self.replica.log.log_end_offset
        return end if self.matched is None else min(self.matched, end)


class ReplicationManager:
    """Owned by the tablet server's event loop."""

    def __init__(
        self,
        server_id: int,
        replicas: ReplicaManager,
        states: BucketStates,
        registry: ServerRegistry,
        peers: PeerConnections,
        table_of: Callable[[int], TableInfo | None],
        lag_max_ms: int,
        silence_max_ms: int,
        fetch_bytes_max: int = 1 << 20,
        fetch_wait_ms: int = 500,
        adjust_isr: AdjustIsr | None = None,
    ) -> None:
        """``fetch_bytes_max`` (``log.replica.fetch.max-bytes-for-bucket``) and ``fetch_wait_ms``
        (``log.replica.fetch.wait-max-time``) shape this server's fetches as a follower; ``adjust_isr`` asks
        the active coordinator to change a led bucket's ISR (AdjustIsr; without it the leader writes the
        change to the bucket states itself, by the same compare-and-set)."""
        self._adjust_isr = adjust_isr
        self._me = server_id
        self._replicas = replicas
        self._states = states
        self._registry = registry
        self._peers = peers
        self._table_of = table_of
        self._lag_max_ms = lag_max_ms
        self._silence_max_ms = silence_max_ms
        self._fetch_bytes_max = fetch_bytes_max
        self._fetch_wait_ms = fetch_wait_ms
        self._leading: dict[TableBucket, _Leading] = {}
        self._following: dict[TableBucket, _Following] = {}
        self._locks: dict[TableBucket, asyncio.Lock] = {}
        self._maintenance: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def server_id(self) -> int:
        return self._me

    def start(self) -> None:
        self._maintenance = asyncio.create_task(self._maintain())

    async def stop(self) -> None:
        for following in self._following.values():
            following.stopped = True
        tasks = [f.task for f in self._following.values() if f.task is not None] + list(self._writes)
        if self._maintenance is not None:
            tasks.append(self._maintenance)
        for task in tasks:
            task.cancel()
        if tasks:
            # bounded: the process is stopping, so a task that does not end (a lost cancellation: a stopped
            # fetch task still ends at its next turn) is abandoned rather than waited for
            _done, pending = await asyncio.wait(tasks, timeout=STOP_WAIT_S)
            if pending:
                log.warning("%d replication tasks did not end within %.0f s of the stop; leaving them",
                            len(pending), STOP_WAIT_S)
        self._checkpoint()

    def _checkpoint(self) -> None:
        """Record every replicated bucket's high watermark (what a restart knows to be committed)."""
        for replica in [*(lead.replica for lead in self._leading.values()),
                        *(following.replica for following in self._following.values())]:
            with contextlib.suppress(OSError, StromError):
                replica.log.checkpoint_high_watermark()

    # ---- role changes ----
    async def apply(self, table: TableInfo, bucket: TableBucket) -> None:
        """Take the bucket's current state from ZooKeeper and lead or follow it accordingly."""
        async with self._locks.setdefault(bucket, asyncio.Lock()):
            found = await asyncio.to_thread(self._states.get, bucket)
            if found is None:
                return
            state, version = found
            if self._me not in state.replicas:
                await self._remove(bucket)  # a reassignment moved this replica elsewhere (or it never was one)
                return
            if state.leader == self._me:
                await self._lead(table, bucket, state, version)
            else:
                await self._follow(table, bucket, state)

    async def apply_all(self, assigned: Iterable[tuple[TableInfo, TableBucket]]) -> list[BaseException | None]:
        """:meth:`apply` to every bucket at once (each has a lock of its own), so that the buckets this
        server now leads open their KV state side by side, on threads; what each raised, in order (None: it
        was applied)."""
        outcomes = await asyncio.gather(*(self.apply(table, bucket) for table, bucket in assigned),
                                        return_exceptions=True)
        return [outcome if isinstance(outcome, BaseException) else None for outcome in outcomes]

    async def _lead(self, table: TableInfo, bucket: TableBucket, state: LeaderAndIsr, version: int) -> None:
        current = self._leading.get(bucket)
        if current is not None and current.state.leader_epoch == state.leader_epoch:
            # an ISR change we made, a repeated notice, or a reassignment adding or removing followers
            current.state, current.version = state, version
            now = _now_ms()
            for replica_id in state.replicas:
                if replica_id != self._me and replica_id not in current.followers:
                    current.followers[replica_id] = _Follower(0, now, now)  # joins the ISR once caught up
            for replica_id in [r for r in current.followers if r not in state.replicas]:
                del current.followers[replica_id]
            self._update_limit(current)
            return
        await self._stop_following(bucket)
        self._replicas.become_leader(table, [bucket])
        replica = self._replicas.replica(bucket)
        replica.is_leader, replica.leader_epoch = True, state.leader_epoch
        now = _now_ms()
        start = replica.open_log().high_watermark  # what every in-sync replica surely has
        followers = {r: _Follower(start, now, now) for r in state.replicas if r != self._me}
        self._leading[bucket] = lead = _Leading(replica, state, version, followers,
                                                epoch_start=replica.log.log_end_offset)
        self._update_limit(lead)  # alone in the ISR, everything durable here is acknowledged
        replica.log.checkpoint_high_watermark()  # from now on a restart finds a record, never "all committed"
        # The KV state catches up from the log, holding what the followers lack: its snapshot's restore and
        # the changelog's replay run on a thread, while the loop serves the server's other buckets and the
        # followers' fetches of this one (its writes and lookups wait for it, as a request's opening does).
        await self._replicas.opened([bucket])
        replica.open()
        log.info("%s: leading at epoch %d (ISR %s)", bucket, state.leader_epoch, list(state.isr))

    async def _follow(self, table: TableInfo, bucket: TableBucket, state: LeaderAndIsr) -> None:
        following = self._following.get(bucket)
        if following is not None and following.leader_epoch == state.leader_epoch:
            return
        self._leading.pop(bucket, None)
        await self._stop_following(bucket)
        self._replicas.become_leader(table, [bucket])  # hosted (as a follower from here on)
        replica = self._replicas.replica(bucket)
        replica.is_leader, replica.leader_epoch = False, state.leader_epoch  # before its storage opens: no KV
        if self._replicas.before_reopen is not None:
            self._replicas.before_reopen(bucket)  # scan sessions end before the RocksDB they read closes
        replica.close_kv(self._replicas.kv_closer)  # RocksDB's flush and close run off the loop
        replica.open_log()
        replica.log.fail_unacknowledged(NotLeaderOrFollowerError(f"{bucket} is now led by server {state.leader}"))
        # Nothing is truncated here: what lies above the recorded high watermark may have been acknowledged
        # (the record lags, and this replica may be the last in-sync one: it may lead next). It is compared
        # with the leader's log instead, and given up only where the two differ (LogTablet.append_from_leader).
        replica.log.set_replication_limit(replica.log.high_watermark)
        try:
            replica.log.checkpoint_high_watermark()
        except (OSError, StromError) as exc:  # a full disk: the once-a-second checkpoint writes it when there is room
            log.warning("%s: recording the high watermark failed (%s); following all the same", bucket, exc)
        if replica.keeps_standby:  # the state reopens as a standby, off the loop too, once its close is done
            await self._replicas.opened([bucket])
        replica.open()
        following = self._following[bucket] = _Following(replica, state.leader, state.leader_epoch)
        if replica.log.high_watermark < replica.log.log_end_offset:
            following.matched = replica.log.high_watermark
        following.task = asyncio.create_task(self._fetch_loop(bucket, following))
        log.info("%s: following server %d at epoch %d", bucket, state.leader, state.leader_epoch)

    async def _remove(self, bucket: TableBucket) -> None:
        """This server is no longer a replica of ``bucket``: stop leading or following it, fail what waits
        for its acknowledgement (clients retry at the new leader), and delete its local data. ZooKeeper no
        longer names it a replica, so it is not electable (docs/cluster.md, "No acknowledged write is lost";
        a rebalance drops a replica only once its replacements are in the ISR)."""
        lead = self._leading.pop(bucket, None)
        await self._stop_following(bucket)
        try:
            replica = self._replicas.replica(bucket)
        except StromError:
            return  # not hosted here
        if lead is not None and replica.is_open:
            replica.log.fail_unacknowledged(NotLeaderOrFollowerError(f"{bucket} moved off server {self._me}"))
        replica.is_leader = False
        await self._replicas.stop_bucket(bucket)
        log.info("%s: replica removed from server %d", bucket, self._me)

    async def _stop_following(self, bucket: TableBucket) -> None:
        following = self._following.pop(bucket, None)
        if following is not None:
            await _stop_fetching(following)

    async def refresh_leading(self) -> None:
        """Take the current state of every bucket led here from ZooKeeper (after a ControlledShutdown moved
        them: this server follows at once rather than when the coordinator's notices arrive)."""
        for bucket in list(self._leading):
            table = self._table_of(bucket.table_id)
            if table is not None:
                await self.apply(table, bucket)

    def forget(self, table_id: int, partition_id: int | None) -> None:
        """The table (or partition) was dropped: stop fetching for its buckets."""
        for bucket in [b for b in (*self._following, *self._leading) if b.table_id == table_id
                       and (partition_id is None or b.partition_id == partition_id)]:
            following = self._following.pop(bucket, None)
            if following is not None and following.task is not None:
                following.stopped = True
                following.task.cancel()
            self._leading.pop(bucket, None)

    # ---- following ----
    async def _fetch_loop(self, bucket: TableBucket, following: _Following) -> None:
        replica = following.replica
        while not following.stopped:
            node = self._registry.live().get(following.leader)
            if node is None:
                await asyncio.sleep(RETRY_S)  # the leader is gone (or there is none): the coordinator elects one
                continue
            if replica.storage_failure is not None:
                # its disk filled up (or failed): reopened once there is room again, as a leader's is on its
                # next request; until then the fetch fails and this replica falls out of the ISR
                replica.recover_if_failed(self._replicas.before_reopen)
            log_tablet = replica.log
            fetch_offset = following.fetch_offset()
            request = pb.FetchLogRequest(
                follower_server_id=self._me, max_bytes=self._fetch_bytes_max, max_wait_ms=self._fetch_wait_ms,
                min_bytes=1,
            )
            table_request = request.tables_req.add(table_id=bucket.table_id, projection_pushdown_enabled=False)
            bucket_request = table_request.buckets_req.add(
                bucket_id=bucket.bucket, fetch_offset=fetch_offset, max_fetch_bytes=self._fetch_bytes_max
            )
            if bucket.partition_id is not None:
                bucket_request.partition_id = bucket.partition_id
            try:
                response = await self._peers.request(node.host, node.port, ApiKey.FETCH_LOG, request,
                                                     server_name=tablet_server_name(node.node_id))
                if following.stopped:
                    return  # this replica leads or follows another leader now: its log is not ours to touch
                answer = response.tables_resp[0].buckets_resp[0]  # type: ignore[attr-defined]
                if answer.HasField("error_code") and answer.error_code != 0:
                    raise error_for_code(answer.error_code, answer.error_message or None)
                if answer.records:
                    matched = await log_tablet.append_from_leader(answer.records, int(time.time() * 1000))
                elif fetch_offset < log_tablet.log_end_offset:
                    # the leader holds nothing durable from here on: what this log holds above was never
                    # acknowledged (an acknowledgement needs the leader's high watermark past it); a
                    # truncation site of docs/cluster.md, "No acknowledged write is lost"
                    await log_tablet.truncate_to(fetch_offset)
                    matched = fetch_offset
                else:
                    matched = fetch_offset
                following.matched = None if matched >= log_tablet.log_end_offset else matched
                await log_tablet.flushed(log_tablet.log_end_offset)
                following.leader_high_watermark = answer.high_watermark
                log_tablet.set_replication_limit(min(answer.high_watermark, following.fetch_offset()))
                following.errors = 0
            except asyncio.CancelledError:
                raise
            except LogOffsetOutOfRangeError:
                leader_start = await self._leader_offset(node, bucket, OFFSET_EARLIEST)
                if following.stopped:
                    return
                if leader_start is not None and fetch_offset < leader_start:
                    # the leader copied what lies below its log start to remote storage and deleted it: this
                    # log cannot be compared there, so it starts where the leader's does (keeping what it
                    # holds from there on, compared next; docs/cluster.md, "No acknowledged write is lost")
                    await log_tablet.start_at(leader_start)
                    following.matched = None if log_tablet.log_end_offset <= leader_start else leader_start
                    continue
                # the fetch offset is past the leader's log (a leader holding less than this replica was told
                # is committed): compare from what the leader has committed instead, truncating nothing yet
                committed = following.leader_high_watermark or await self._leader_offset(node, bucket, OFFSET_LATEST)
                following.matched = min(fetch_offset, committed or 0)
                await asyncio.sleep(RETRY_S)
            except Exception as exc:
                following.errors += 1
                if following.errors in (1, 50):
                    log.info("%s: fetching from server %d failed: %s", bucket, following.leader, exc)
                await asyncio.sleep(RETRY_S)

    async def _leader_offset(self, node: ServerNode, bucket: TableBucket, offset_type: int) -> int | None:
        """The leader's local log start (EARLIEST) or high watermark (LATEST), asked as a follower; None
        when it cannot be asked."""
        request = pb.ListOffsetsRequest(follower_server_id=self._me, offset_type=offset_type,
                                        table_id=bucket.table_id, bucket_id=[bucket.bucket])
        if bucket.partition_id is not None:
            request.partition_id = bucket.partition_id
        try:
            response = await self._peers.request(node.host, node.port, ApiKey.LIST_OFFSETS, request,
                                                 server_name=tablet_server_name(node.node_id))
        except Exception:
            return None
        answer = response.buckets_resp[0]  # type: ignore[attr-defined]
        return None if answer.HasField("error_code") and answer.error_code != 0 else int(answer.offset)

    # ---- leading ----
    def on_follower_fetch(self, bucket: TableBucket, follower: int, fetch_offset: int) -> bool:
        """A follower asks for what follows ``fetch_offset``: it holds everything below it durably. True
        when the high watermark moved past what the follower was last told: answer it now."""
        lead = self._leading.get(bucket)
        if lead is None:
            raise NotLeaderOrFollowerError(f"server {self._me} does not lead {bucket}")
        progress = lead.followers.get(follower)
        if progress is None:
            raise NotLeaderOrFollowerError(f"server {follower} is not a replica of {bucket}")
        log_tablet = lead.replica.log
        if fetch_offset > log_tablet.log_end_offset:
            # it holds batches this log never had (a former leader's): counted, they would let the high
            # watermark pass writes it lacks; it truncates and fetches again
            raise LogOffsetOutOfRangeError(
                f"fetch offset {fetch_offset} of server {follower} is past the end {log_tablet.log_end_offset} "
                f"of {bucket}'s log at its leader"
            )
        progress.fetch_offset = fetch_offset
        progress.fetched_ms = _now_ms()
        if fetch_offset >= log_tablet.durable_end:
            progress.caught_up_ms = _now_ms()
        if (follower not in lead.state.isr and fetch_offset >= max(log_tablet.high_watermark, lead.epoch_start)
                and not lead.changing):
            self._change_isr(bucket, lead, (*lead.state.isr, follower))  # it has everything committed
        self._update_limit(lead)
        if log_tablet.high_watermark > progress.told_high_watermark:
            progress.told_high_watermark = log_tablet.high_watermark
            return True
        return False

    def in_sync_count(self, bucket: TableBucket) -> int:
        """How many replicas of a bucket this server leads are in sync (itself included): the ISR as the
        leader acts on it (a follower an ISR write in flight adds does not count yet)."""
        lead = self._leading.get(bucket)
        if lead is None:
            raise NotLeaderOrFollowerError(f"server {self._me} does not lead {bucket}")
        return len(lead.state.isr)

    def _update_limit(self, lead: _Leading) -> None:
        """The high watermark may reach what every member of the ISR holds: the ISR as the leader acts on
        it, and while a write adds followers, those too (the largest ISR ZooKeeper may hold)."""
        offsets = [lead.followers[r].fetch_offset for r in (*lead.state.isr, *lead.joining)
                   if r != self._me and r in lead.followers]
        lead.replica.log.set_replication_limit(min(offsets) if offsets else None)

    def _change_isr(self, bucket: TableBucket, lead: _Leading, isr: tuple[int, ...]) -> None:
        lead.changing = True
        # followers this write adds, and any whose earlier write never answered, count until it is settled
        lead.joining = tuple({*lead.joining, *(r for r in isr if r not in lead.state.isr)})
        self._update_limit(lead)
        task = asyncio.create_task(self._write_isr(bucket, lead, tuple(sorted(set(isr)))))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_isr(self, bucket: TableBucket, lead: _Leading, isr: tuple[int, ...]) -> None:
        try:
            new = lead.state.with_isr(isr)
            if self._adjust_isr is None:
                written = await asyncio.to_thread(self._states.compare_and_set, bucket, new, lead.version)
                version: int | None = lead.version + 1 if written else None
            else:
                version = await self._adjust_isr(bucket, lead.state, lead.version, isr)
            if version is not None:
                lead.state, lead.version, lead.joining = new, version, ()
                self._update_limit(lead)
                log.info("%s: ISR is now %s", bucket, list(isr))
                return
            # someone else changed the bucket (the coordinator moved its leadership, or an earlier write of
            # ours whose answer was lost landed): take the state ZooKeeper holds, then nothing is unknown
            table = self._table_of(bucket.table_id)
            if table is not None:
                await self.apply(table, bucket)
            lead.joining = ()
            self._update_limit(lead)
        except Exception as exc:  # the write may or may not have landed: whoever it added still counts
            log.warning("%s: changing the ISR failed: %s", bucket, exc)
        finally:
            lead.changing = False

    async def _recheck_roles(self) -> None:
        """Lead or follow each hosted bucket as ZooKeeper says, where this server's role or epoch differs, and
        take up the ISR and replicas a leader's state has in ZooKeeper where they differ from its own (the
        coordinator changed them at the same epoch, and its notice was lost: a leader that still counted a
        dead follower in the ISR would never let it join again)."""
        buckets = [*self._leading, *self._following]
        if not buckets:
            return
        found = await asyncio.to_thread(self._states.get_many, buckets)
        for bucket, state in found.items():
            lead, following = self._leading.get(bucket), self._following.get(bucket)
            if lead is not None and state.leader == self._me and state.leader_epoch == lead.state.leader_epoch:
                if lead.changing or (state.isr, state.replicas) == (lead.state.isr, lead.state.replicas):
                    continue  # an ISR change of its own in flight is taken up where it ends
                what = "ISR"
            elif following is not None and state.leader != self._me and state.leader_epoch == following.leader_epoch:
                continue
            else:
                what = "role"
            table = self._table_of(bucket.table_id)
            if table is not None:
                log.info("%s: ZooKeeper names leader %d at epoch %d (ISR %s), unlike this replica's %s; taking it up",
                         bucket, state.leader, state.leader_epoch, list(state.isr), what)
                await self.apply(table, bucket)

    def _watching_followers(self) -> bool:
        """Whether a bucket led here has another replica in its ISR or joining it."""
        me = self._me
        return any(r != me for lead in self._leading.values() for r in (*lead.state.isr, *lead.joining))

    async def _maintain(self) -> None:
        """Shrink the ISR of followers that fell behind or fell silent, keep the high watermark recorded, and
        take up role changes whose notice never came."""
        last_checkpoint = last_recheck = time.monotonic()
        while True:
            # a follower's lag is only watched where one is in an ISR or joining it; with none (every bucket
            # with one replica) this loop wakes for the checkpoint alone
            await asyncio.sleep(ISR_CHECK_S if self._watching_followers() else CHECKPOINT_S)
            if time.monotonic() - last_recheck > RECHECK_ROLES_S:
                last_recheck = time.monotonic()
                try:
                    await self._recheck_roles()
                except Exception as exc:  # ZooKeeper unreachable for now: the next round tries again
                    log.info("checking the replicas' roles against ZooKeeper failed: %s", exc)
            now = _now_ms()
            for bucket, lead in list(self._leading.items()):
                if lead.changing:
                    continue
                # a follower still counted as joining (its ISR write failed without an answer) is dropped
                # like an ISR member, or a dead one would hold the high watermark for good
                lagging = [r for r in (*lead.state.isr, *lead.joining) if r != self._me and r in lead.followers
                           and (now - lead.followers[r].caught_up_ms > self._lag_max_ms
                                or now - lead.followers[r].fetched_ms > self._silence_max_ms)]
                if lagging:
                    self._change_isr(bucket, lead, tuple(r for r in lead.state.isr if r not in lagging))
            if time.monotonic() - last_checkpoint > CHECKPOINT_S:
                last_checkpoint = time.monotonic()
                self._checkpoint()


async def _stop_fetching(following: _Following) -> None:
    """Stop a follower's fetch task and wait until it ended, cancelling again should a cancellation be lost."""
    following.stopped = True
    task = following.task
    while task is not None and not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_WAIT_S)
        if not task.done():
            log.warning("a fetch task did not end within %.0f s of its cancellation; cancelling again", STOP_WAIT_S)


def _now_ms() -> float:
    return time.monotonic() * 1000


__all__ = ["ReplicationManager"]
