"""The kit's scheduler under vLLM's async scheduling (vLLM 0.27.1's ``AsyncScheduler``).

The engine (``emu.impl.kit.engine``, its ``step_with_batch_queue``) schedules step n+1
before step n's output is processed. Each scheduled request that is past its prompt
will sample, so its step adds output placeholders: one for the token it samples and one
per draft verified in it. ``num_computed_tokens`` counts them at once, so the next
``schedule()`` continues after them, and with MTP each such request holds k placeholder
drafts (vLLM's -1 ids; the worker puts its own drafts in their place). When the output
lands, the rejected drafts and then the emitted tokens leave the placeholders again.
The rest of the bookkeeping (the last-token rule, stale output after a preemption,
deferred frees) is in the base ``emu.impl.kit.scheduler.Scheduler``, as in vLLM.
"""

from __future__ import annotations

from emu.impl.kit.scheduler import Request, Scheduler, SchedulerOutput


class AsyncScheduler(Scheduler):
    """``Scheduler`` with vLLM's async scheduling (same constructor)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # A kv_consumer connector and two batches in flight: a freed request's blocks
        # may still be written by the step in flight.
        self.defer_block_free = self.connector is not None

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        super()._update_after_schedule(output)
        drafts = output.scheduled_spec_decode_tokens
        requests = self.requests
        for req_id in output.num_scheduled_tokens:
            request = requests[req_id]
            if request.is_prefill_chunk:
                continue
            request.num_output_placeholders += 1 + drafts.get(req_id, 0)
            request.num_spec_tokens = self.num_spec_tokens

    def _update_request_with_output(self, request: Request, num_sampled: int, now_s: float,
                                    stale: bool) -> int:
        num_new = super()._update_request_with_output(request, num_sampled, now_s, stale)
        if not stale:  # a stale output's placeholders went at the preemption
            request.num_output_placeholders -= num_new
        return num_new
