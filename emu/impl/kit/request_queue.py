"""The waiting queues of the stub scheduler, as vLLM's
``vllm/v1/core/sched/request_queue.py``: FCFS (a deque) and PRIORITY (a heap).
``Scheduler`` holds two of the same kind, ``waiting`` and ``skipped_waiting``, made by
:func:`create_request_queue` from its scheduling policy."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

from emu.impl.kit.request import Request


class FCFSRequestQueue(deque):
    """vLLM's FCFS waiting queue: a deque, iterated front to back."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def pop_request(self) -> Request:
        return self.popleft()

    def peek_request(self) -> Request:
        return self[0]

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def prepend_requests(self, requests: list[Request]) -> None:
        """Put ``requests`` at the front, keeping their order."""
        self.extendleft(reversed(requests))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        kept = [r for r in self if id(r) not in drop]
        self.clear()
        self.extend(kept)


class PriorityRequestQueue:
    """vLLM's PRIORITY waiting queue: a heap ordered by ``Request.__lt__``; iteration
    yields requests in that order. "Prepending" is just adding."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)

    def peek_request(self) -> Request:
        return self._heap[0]

    prepend_request = add_request

    def prepend_requests(self, requests: list[Request]) -> None:
        for request in requests:
            heapq.heappush(self._heap, request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        self._heap = [r for r in self._heap if id(r) not in drop]
        heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    """An empty waiting queue for ``policy`` ("fcfs" or "priority", already checked)."""
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()
