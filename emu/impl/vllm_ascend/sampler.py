"""What the emulated worker samples in each forward, and the drafts its MTP layer proposes.

vLLM's scheduler decides which tokens run; the worker's model runner samples them. No
model runs here, so the rank's forward (``engine.EmulatedRank.forward``) asks
``EmulatedSampler`` which tokens each scheduled request gets:

- a request whose prompt is not all computed yet (a prefill chunk) gets none;
- any other request gets one token, and with speculative decoding also the drafts the
  target accepts among those scheduled for it (``scheduled_spec_decode_tokens``): the
  prefix chosen by ``emu.rank.spec_decode.DraftAcceptance``, the kit's rule (a hash of
  seed, request and output position).

After a forward with speculative decoding every request that sampled has k new drafts.
With synchronous scheduling vLLM's engine hands them to the scheduler
(``take_draft_token_ids`` -> ``update_draft_token_ids``), which schedules them by id.
With async scheduling the scheduler has already scheduled the next step, with
placeholder ids (-1) for the drafts, and the model runner puts its own drafts in their
place for the requests that were in its previous batch. So a scheduled draft is real
when its id is not a placeholder, or when the request sampled in the previous forward;
otherwise -- the scheduler's padding of a request back from the waiting queue to 1 + k
tokens, or a request new to the batch under async scheduling -- it is a placeholder,
never accepted. A draft's output position is the worker's count of the tokens it sampled
for the request, which under async scheduling runs ahead of the scheduler's.
"""

from __future__ import annotations

from vllm.v1.outputs import DraftTokenIds

from emu.rank.spec_decode import DraftAcceptance

# The token every emulated forward samples and drafts (any id below the vocab size).
SAMPLED_TOKEN = 1
# The draft id vLLM's scheduler schedules in place of a draft it does not have.
PLACEHOLDER_DRAFT = -1


class EmulatedSampler:
    """One rank's sampler; ``acceptance`` is None for plain decode (no drafts)."""

    def __init__(self, acceptance: DraftAcceptance | None):
        self.acceptance = acceptance
        self._drafted: list[str] = []  # the requests given drafts in the last forward
        self._num_sampled: dict[str, int] = {}  # tokens sampled so far, per request

    def sample(self, scheduler_output, requests) -> list[list[int]]:
        """The sampled token ids of each request of ``scheduler_output``, in its order;
        called once per forward, after ``schedule()`` counted the scheduled tokens as
        computed."""
        acceptance = self.acceptance
        drafts = scheduler_output.scheduled_spec_decode_tokens
        in_last_batch = set(self._drafted)
        counts = self._num_sampled
        for req_id in scheduler_output.finished_req_ids:
            counts.pop(req_id, None)
        sampled: list[list[int]] = []
        drafted: list[str] = []
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests[req_id]
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])
                continue
            position = counts.get(req_id, request.num_output_tokens)
            num_new = 1
            scheduled = drafts.get(req_id)
            if scheduled and (PLACEHOLDER_DRAFT not in scheduled or req_id in in_last_batch):
                num_new += acceptance.num_accepted(req_id, position, len(scheduled))
            sampled.append([SAMPLED_TOKEN] * num_new)
            counts[req_id] = position + num_new
            drafted.append(req_id)
        if acceptance is not None:
            self._drafted = drafted
        return sampled

    def num_tokens(self, request) -> int:
        """The request's prompt and output tokens as the worker has them, for the step
        cost: the scheduler's count plus, under async scheduling, the tokens of the step
        whose output it has not processed yet."""
        return request.num_prompt_tokens + self._num_sampled.get(request.request_id,
                                                                 request.num_output_tokens)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed in the last forward (the executor's
        ``take_draft_token_ids``, with synchronous scheduling): k per request that
        sampled, or None without speculative decoding."""
        if self.acceptance is None:
            return None
        k = self.acceptance.num_speculative_tokens
        return DraftTokenIds(list(self._drafted), [[SAMPLED_TOKEN] * k for _ in self._drafted])
