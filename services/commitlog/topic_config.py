"""Topic configuration: topic -> read/write queue counts and permission, kept in config/topics.json.

Topics come into the table four ways: CreateTopic, a first message (auto-creation, with
``defaultTopicQueueNums`` queues), the DELAY rewrite (``SCHEDULE_TOPIC_XXXX``, one queue per delay
level, as RocketMQ's broker creates it), and discovery at start (topics the store's data already
holds, see ``topic_discovery.py``). DeleteTopic takes one out; its name is then kept in the file's
``deleted`` list so that discovery at the next start does not bring it back from the records the
commitlog still holds (they expire as usual). Creating the topic again takes the name off that list.

A change is one durable journal entry, not a rewrite of the whole file (services/store/formats/
topics_file.py, table_journal.py): CreateTopic costs the same with 100,000 topics as with ten. The
table changes in place under the lock; readers that iterate it (``list``) copy it under the lock.

On a replicated shard, ``log_change`` appends each CreateTopic/UpdateTopic/DeleteTopic to the log
(``services/store/metadata_log.py``) under the table's lock, before the table changes; a
follower applies what its leader logged with :meth:`apply`. Auto-creation is not logged: a follower
creates the topic the same way when the topic's first record reaches it.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from services.store.disk_space import disk_full_error, is_disk_full
from services.store.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, StoreError
from services.store.formats.message import SCHEDULE_TOPIC
from services.store.formats.table_journal import TableJournal
from services.store.formats.topics_file import delete_entry, encode_snapshot, put_entry, read_snapshot
from services.store.metadata_log import TopicChange
from services.store.rules.names import MAX_QUEUE_NUMS, is_system_topic
from services.store.rules.topics import TopicConfig, check_topic_config
from services.store.rules.transaction_records import TRANSACTION_TOPIC_QUEUES, TRANSACTION_TOPICS

log = logging.getLogger(__name__)


class TopicConfigManager:
    def __init__(self, path: Path, default_queue_nums: int = 8, schedule_queue_nums: int = 18) -> None:
        """``schedule_queue_nums``: how many delay levels ``messageDelayLevel`` has (level n parks in
        queue n - 1 of SCHEDULE_TOPIC_XXXX)."""
        self.path = path
        self.default_queue_nums = default_queue_nums
        self.schedule_queue_nums = max(schedule_queue_nums, 1)
        self._lock = threading.Lock()
        self._topics: dict[str, TopicConfig] = {}
        #: Topics deleted since the data of which discovery must not re-add (see the module docstring).
        self._deleted: set[str] = set()
        self._journal = TableJournal(path)
        #: Set on a replicated shard: writes the change to the log. Raises if it was not written (the
        #: table is left as it is); returns the error to answer with after applying it when it was
        #: written but not acknowledged (SYNC_MASTER's followers lack it: they get it as they catch up).
        self.log_change: Callable[[TopicChange], StoreError | None] | None = None

    def load(self) -> None:
        """The snapshot with the journal replayed; a journal with entries is folded into a new snapshot
        at once (a start is rare, and the journal then starts empty)."""
        table = read_snapshot(self.path)
        entries = self._journal.open()
        table.apply(entries)
        self._topics = {name: TopicConfig(topic=name, **fields) for name, fields in table.topics.items()}
        self._deleted = table.deleted
        if entries:
            with self._lock:
                self._compact()

    def close(self) -> None:
        """At a clean stop: the journal folded into topics.json (a stopped store's table is one file,
        as RocketMQ's tools expect), the previous snapshot kept as topics.json.bak."""
        with self._lock:
            if self._journal.entries:
                self._compact()
            self._journal.close()

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def list(self) -> list[TopicConfig]:
        with self._lock:  # the table changes in place
            configs = builtins.list(self._topics.values())
        return sorted(configs, key=lambda c: c.topic)

    def auto_config(self, topic: str) -> TopicConfig:
        """The config a topic gets when its first message creates it."""
        if topic in TRANSACTION_TOPICS:  # RocketMQ creates them with one queue (TransactionalMessageUtil)
            return TopicConfig(topic, TRANSACTION_TOPIC_QUEUES, TRANSACTION_TOPIC_QUEUES)
        nums = self.schedule_queue_nums if topic == SCHEDULE_TOPIC else self.default_queue_nums
        return TopicConfig(topic, nums, nums)

    def create(self, config: TopicConfig) -> TopicConfig:
        check_topic_config(config)
        self._check_schedule_topic(config)
        with self._lock:
            if config.topic in self._topics:
                raise AlreadyExistsError(f"topic {config.topic!r} exists: use UpdateTopic to change it")
            unacknowledged = self._log(TopicChange(config.topic, config))
            self._put(config)
        if unacknowledged is not None:
            raise unacknowledged
        return config

    def update(self, config: TopicConfig) -> TopicConfig:
        check_topic_config(config)
        self._check_schedule_topic(config)
        with self._lock:
            if config.topic not in self._topics:
                raise NotFoundError(f"topic {config.topic!r} does not exist: create it first")
            unacknowledged = self._log(TopicChange(config.topic, config))
            self._put(config)
        if unacknowledged is not None:
            raise unacknowledged
        return config

    def delete(self, topic: str) -> TopicConfig:
        """Takes the topic out of the table (NotFoundError if it is not there) and remembers its name
        as deleted. System topics are refused: the store's own flows write them."""
        if is_system_topic(topic):
            raise InvalidArgumentError(f"topic {topic!r} is a system topic: the store's own flows use it, it "
                                       "cannot be deleted")
        with self._lock:
            found = self._topics.get(topic)
            if found is None:
                raise NotFoundError(f"topic {topic!r} does not exist: nothing to delete")
            unacknowledged = self._log(TopicChange(topic, None))
            self._drop(topic)
        if unacknowledged is not None:
            raise unacknowledged
        return found

    def apply(self, change: TopicChange) -> None:
        """A change the leader logged (no checks: the leader made them); applying it again is harmless."""
        with self._lock:
            if change.config is not None:
                self._put(change.config)
            elif change.topic in self._topics or change.topic not in self._deleted:
                self._drop(change.topic)

    def _log(self, change: TopicChange) -> StoreError | None:
        return None if self.log_change is None else self.log_change(change)

    def _drop(self, topic: str) -> None:
        self._append(delete_entry(topic))
        self._topics.pop(topic, None)
        self._deleted.add(topic)
        self._compact_if_due()

    def is_deleted(self, topic: str) -> bool:
        return topic in self._deleted

    def get_or_create(self, topic: str) -> TopicConfig:
        found = self._topics.get(topic)
        if found is not None:
            return found
        with self._lock:
            found = self._topics.get(topic)
            if found is None:
                found = self.auto_config(topic)
                self._put(found)
            return found

    def merge_discovered(self, queue_nums: Mapping[str, int]) -> builtins.list[TopicConfig]:
        """At start: add the topics the store's data holds but the table lacks (``queue_nums``: topic ->
        queue count), and give SCHEDULE_TOPIC_XXXX a queue per delay level if it has fewer (a store
        written before, or with fewer ``messageDelayLevel`` levels). A configured topic is otherwise
        kept as it is: its counts may have been lowered on purpose (UpdateTopic), so a queue that
        still holds data is no reason to undo that. Returns the configs added or changed; the file is
        written once, only if something changed."""
        with self._lock:
            topics = dict(self._topics)
            changed: builtins.list[TopicConfig] = []
            for topic, nums in sorted(queue_nums.items()):
                if topic not in topics and topic not in self._deleted:
                    nums = min(max(nums, 1), MAX_QUEUE_NUMS)
                    if topic == SCHEDULE_TOPIC:
                        nums = max(nums, self.schedule_queue_nums)
                    topics[topic] = TopicConfig(topic, nums, nums)
                    changed.append(topics[topic])
            schedule = topics.get(SCHEDULE_TOPIC)
            levels = self.schedule_queue_nums
            if schedule is not None and min(schedule.read_queue_nums, schedule.write_queue_nums) < levels:
                topics[SCHEDULE_TOPIC] = TopicConfig(SCHEDULE_TOPIC, max(schedule.read_queue_nums, levels),
                                                     max(schedule.write_queue_nums, levels), schedule.perm)
                changed.append(topics[SCHEDULE_TOPIC])
            if changed:
                self._topics = topics
                self._compact()
            return changed

    def _check_schedule_topic(self, config: TopicConfig) -> None:
        levels = self.schedule_queue_nums
        if config.topic == SCHEDULE_TOPIC and min(config.read_queue_nums, config.write_queue_nums) < levels:
            raise InvalidArgumentError(
                f"{SCHEDULE_TOPIC} needs {levels} read and write queues, one per delay level of messageDelayLevel "
                f"(levels 1..{levels} park in queues 0..{levels - 1}): give it at least {levels}")

    # -- persistence (callers hold the lock) -----------------------------------------------------
    def _put(self, config: TopicConfig) -> None:
        self._append(put_entry(config.topic, _fields(config)))
        self._topics[config.topic] = config
        self._deleted.discard(config.topic)
        self._compact_if_due()

    def _append(self, entry: dict[str, object]) -> None:
        """The change made durable before the table shows it: a failed write changes nothing."""
        try:
            self._journal.append([entry])
        except OSError as exc:
            raise self._write_error(exc) from None

    def _compact_if_due(self) -> None:
        if self._journal.due(len(self._topics)):
            try:
                self._compact()
            except (OSError, StoreError) as exc:  # the change itself is durable in the journal
                log.warning("folding %s into a new snapshot failed (the journal keeps every change; the next "
                            "change tries again): %s", self.path.name, exc)

    def _compact(self) -> None:
        data = encode_snapshot({name: _fields(c) for name, c in self._topics.items()}, self._deleted)
        try:
            self._journal.compact(data, keep_backup=True)
        except OSError as exc:
            raise self._write_error(exc) from None

    def _write_error(self, exc: OSError) -> Exception:
        if is_disk_full(exc):
            return disk_full_error(self.path.parent, f"writing {self.path.name}", exc)
        return exc


def _fields(config: TopicConfig) -> dict[str, object]:
    return {k: v for k, v in asdict(config).items() if k != "topic"}
