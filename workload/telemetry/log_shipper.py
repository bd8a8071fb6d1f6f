"""Structured JSON lines to a CloudWatch Logs stream, buffered and sent in batches.

The log group belongs to the Pulumi stack (retention and KMS are set there); the job only creates its own
stream in it, so its role needs no logs:CreateLogGroup. A failed send logs a warning and drops the batch:
logs must never stop the job.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

_log = logging.getLogger(__name__)

# PutLogEvents takes at most 10,000 events and 1,048,576 bytes (each event counted with 26 bytes more).
_MAX_EVENTS = 10_000
_MAX_BYTES = 1_048_576
_EVENT_OVERHEAD = 26
# One event may hold at most 256 KiB; the job's lines are far smaller, so a bigger one is a bug worth seeing.
_MAX_EVENT_BYTES = 256 * 1024 - _EVENT_OVERHEAD


def _chunks(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for event in events:
        event_size = len(event["message"].encode()) + _EVENT_OVERHEAD
        if current and (len(current) >= _MAX_EVENTS or size + event_size > _MAX_BYTES):
            chunks.append(current)
            current, size = [], 0
        current.append(event)
        size += event_size
    if current:
        chunks.append(current)
    return chunks


class LogShipper:
    def __init__(self, client: Any, group: str, stream: str) -> None:
        self._client = client
        self._group = group
        self._stream = stream
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._buffer: list[dict[str, Any]] = []
        self._stream_ready = False

    @property
    def stream(self) -> str:
        return self._stream

    def emit(self, record: dict[str, Any]) -> None:
        """Queue one JSON line; `flush` sends it."""
        message = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
        if len(message.encode()) > _MAX_EVENT_BYTES:
            _log.warning(
                "dropped a %s log line of %d bytes (over the 256 KiB event limit)",
                record.get("event"),
                len(message.encode()),
            )
            return
        with self._lock:
            self._buffer.append({"timestamp": int(time.time() * 1000), "message": message})

    def flush(self) -> None:
        with self._lock:
            events, self._buffer = self._buffer, []
        if not events:
            return
        # Sends from two threads must not interleave: a stream takes events in time order only.
        with self._send_lock:
            if not self._ensure_stream():
                return
            events.sort(key=lambda event: event["timestamp"])
            for chunk in _chunks(events):
                try:
                    self._client.put_log_events(logGroupName=self._group, logStreamName=self._stream, logEvents=chunk)
                except (BotoCoreError, ClientError) as error:
                    _log.warning("could not send %d log events to %s: %s", len(chunk), self._group, error)

    def _ensure_stream(self) -> bool:
        if self._stream_ready:
            return True
        try:
            self._client.create_log_stream(logGroupName=self._group, logStreamName=self._stream)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ResourceAlreadyExistsException":
                _log.warning("could not create log stream %s in %s: %s", self._stream, self._group, error)
                return False
        except BotoCoreError as error:
            _log.warning("could not create log stream %s in %s: %s", self._stream, self._group, error)
            return False
        self._stream_ready = True
        return True
