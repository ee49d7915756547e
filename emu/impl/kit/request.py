"""One request on an emulated rank, as vLLM's ``vllm/v1/request.py``: token counts,
lifecycle status, and the times the event log records. The scheduler
(``emu.impl.kit.scheduler``) creates none: the engine builds one per arrival and hands
it to ``Scheduler.add_request``; the scheduler and ``DyntraLBPolicy`` then move it
through its statuses."""

from __future__ import annotations

from typing import Any

from dyntra_lb.policy import RequestStatus

__all__ = ["Request", "RequestStatus"]


class Request:
    """One request on this rank: token counts, lifecycle status, and the few times the
    event log records (``first_scheduled_s``, ``token_times_s``, ``finish_s``,
    ``pauses`` as ``[start_s, end_s or None]`` pairs)."""

    __slots__ = ("request_id", "prompt_tokens", "output_tokens", "arrival_time",
                 "priority", "num_tokens", "num_computed_tokens", "num_output_tokens", "status",
                 "num_preemptions", "first_scheduled_s", "token_times_s", "finish_s",
                 "pauses", "num_spec_tokens", "is_prefill_chunk", "num_output_placeholders",
                 "num_in_flight_tokens", "num_stale_output_tokens", "last_sched_seq")

    def __init__(self, request_id: str, prompt_tokens: int, output_tokens: int,
                 arrival_time: float = 0.0, priority: int = 0):
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError(
                f"request {request_id}: prompt_tokens and output_tokens must be >= 1")
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens  # max tokens; the request finishes there
        self.arrival_time = arrival_time
        self.priority = priority
        # num_tokens = prompt + generated (vLLM's len(all_token_ids)); a plain attribute
        # kept in step with num_output_tokens by the scheduler, as it is read for every
        # request in every step.
        self.num_tokens = prompt_tokens
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        self.token_times_s: list[float] = []
        self.finish_s: float | None = None
        self.pauses: list[list[float | None]] = []
        # Draft tokens proposed for the next step (vLLM's len(spec_token_ids)).
        self.num_spec_tokens = 0
        # Whether its last schedule() left part of its tokens to compute (vLLM's flag;
        # a running prefill keeps the next waiting request from being padded).
        self.is_prefill_chunk = False
        # Async scheduling (emu.impl.kit.async_scheduler), vLLM's fields of the same names:
        # tokens (sampled and drafts) of steps whose output has not been processed yet,
        # which num_computed_tokens already counts;
        self.num_output_placeholders = 0
        # the tokens scheduled in those steps;
        self.num_in_flight_tokens = 0
        # the share of them whose output was in flight when the request was preempted:
        # still delivered, but it changes neither the computed tokens nor the
        # placeholders, and the request waits until it has drained;
        self.num_stale_output_tokens = 0
        # the scheduler's step sequence number when it was last scheduled (a freed
        # request's blocks wait for that step's output, see Scheduler._free_request_blocks).
        self.last_sched_seq = 0

    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    def __lt__(self, other: Request) -> bool:
        """PRIORITY-policy order, as vLLM: priority, then arrival time, then id."""
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        return self.request_id < other.request_id

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens})")

    def record(self) -> dict[str, Any]:
        """The per-request fields of the event log (the engine adds ``kind``, ``rank``)."""
        return {
            "request_id": self.request_id,
            "arrival_s": self.arrival_time,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "first_scheduled_s": self.first_scheduled_s,
            "token_times_s": list(self.token_times_s),
            "finish_s": self.finish_s,
            "pauses": [list(p) for p in self.pauses],
        }
