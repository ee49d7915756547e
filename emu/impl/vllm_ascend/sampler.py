"""What the emulated worker samples in each forward, and the drafts its MTP layer proposes.

vLLM's scheduler decides which tokens run; the worker's model runner samples them. No
model runs here, so the rank's forward (``engine.EmulatedRank.forward``) asks
``EmulatedSampler`` which tokens each scheduled request gets:

- a request whose prompt is not all computed yet (a prefill chunk) gets none;
- any other request gets one token, and with speculative decoding also the drafts
  scheduled for it (``scheduled_spec_decode_tokens``) that the target accepts: the
  prefix chosen by ``emu.rank.spec_decode.DraftAcceptance``, the kit's rule (a hash of
  seed, request and output position). Placeholder drafts (id -1: the scheduler pads a
  request back from the waiting queue to 1 + k tokens) are never accepted.

After a forward with speculative decoding, every request that sampled holds k new
drafts; vLLM's engine takes them (``take_draft_token_ids``, after ``update_from_output``)
and hands them to the scheduler (``update_draft_token_ids``), which schedules them with
the next token and rolls back the rejected ones itself.
"""

from __future__ import annotations

from vllm.v1.outputs import DraftTokenIds

from emu.rank.spec_decode import DraftAcceptance

# The token every emulated forward samples and drafts (any id below the vocab size).
SAMPLED_TOKEN = 1
# The draft id vLLM's scheduler pads with.
PLACEHOLDER_DRAFT = -1


class EmulatedSampler:
    """One rank's sampler; ``acceptance`` is None for plain decode (no drafts)."""

    def __init__(self, acceptance: DraftAcceptance | None):
        self.acceptance = acceptance
        self._drafted: list[str] = []  # the requests that sampled in the last forward

    def sample(self, scheduler_output, requests) -> list[list[int]]:
        """The sampled token ids of each request of ``scheduler_output``, in its order;
        called once per forward, after ``schedule()`` counted the scheduled tokens as
        computed."""
        acceptance = self.acceptance
        drafts = scheduler_output.scheduled_spec_decode_tokens
        sampled: list[list[int]] = []
        drafted: list[str] = []
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests[req_id]
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])
                continue
            num_new = 1
            scheduled = drafts.get(req_id)
            if scheduled and PLACEHOLDER_DRAFT not in scheduled:
                num_new += acceptance.num_accepted(req_id, request.num_output_tokens,
                                                   len(scheduled))
            sampled.append([SAMPLED_TOKEN] * num_new)
            drafted.append(req_id)
        if acceptance is not None:
            self._drafted = drafted
        return sampled

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed in the last forward (the executor's
        ``take_draft_token_ids``): k per request that sampled, or None without
        speculative decoding."""
        if self.acceptance is None:
            return None
        req_ids, self._drafted = self._drafted, []
        k = self.acceptance.num_speculative_tokens
        return DraftTokenIds(req_ids, [[SAMPLED_TOKEN] * k for _ in req_ids])
