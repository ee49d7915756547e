"""The worker's side of a kit step: what each forward samples, with MTP how many of the
drafts it verified are accepted, and which remote KV loads have landed by its end.

No model runs. The engine (``emu.impl.kit.engine``) hands every ``schedule()``'s output
to ``ModelRunner.execute_model`` when the forward has been priced, and gives the
``ModelRunnerOutput`` to the scheduler's ``update_from_output``: at once with
synchronous scheduling, one iteration later with async scheduling, as vLLM's engine
does. What is sampled is decided here, at the forward, by the worker's own count of
each request's tokens, which under async scheduling runs ahead of the scheduler's:

- a request whose prompt is not all computed (a prefill chunk) samples nothing;
- any other request samples one token and, when drafts were scheduled for it, the drafts
  the target accepts (``emu.rank.spec_decode.DraftAcceptance``, at the worker's output
  positions). A scheduled draft is one the drafter proposed when the request sampled in
  the previous forward; otherwise it is a placeholder (id -1 in vLLM), never accepted:
  the padding of a request back from the waiting queue to 1 + k tokens, and under async
  scheduling every draft of a request that was not in the previous forward (the
  scheduler only ever holds placeholders then, and the worker puts its own drafts in
  their place for the requests of its previous batch).

The vllm-ascend ranks' worker (``emu.impl.vllm_ascend.sampler``) follows the same rules
on vLLM's scheduler output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emu.rank.remote_kv import RemoteKVConnector
from emu.rank.spec_decode import DraftAcceptance


@dataclass(slots=True)
class ModelRunnerOutput:
    """What one forward hands back: the tokens each request of its batch sampled (a
    prefill chunk none), when the forward ended (the time of those tokens), and the
    remote KV loads that had landed by then (``failed_recving``: those whose blocks
    arrived invalid, request id -> block ids)."""

    sampled: dict[str, int]
    ended_s: float
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: dict[str, list[int]] = field(default_factory=dict)


class ModelRunner:
    """One kit rank's emulated worker. ``acceptance`` is None without drafts;
    ``placeholder_drafts``: the scheduler holds placeholders only (async scheduling)."""

    def __init__(self, acceptance: DraftAcceptance | None,
                 connector: RemoteKVConnector | None, *, placeholder_drafts: bool):
        self.acceptance = acceptance
        self.connector = connector
        self.placeholder_drafts = placeholder_drafts
        self._num_sampled: dict[str, int] = {}  # output tokens sampled so far, per request
        self._sampled_ids: list[str] = []  # the requests that sampled in the last forward

    def execute_model(self, scheduler_output, requests: dict, ended_s: float
                      ) -> ModelRunnerOutput:
        """The forward of ``scheduler_output`` (``requests``: the scheduler's, by id),
        ended at virtual time ``ended_s``."""
        counts = self._num_sampled
        acceptance = self.acceptance
        for req_id in scheduler_output.finished_req_ids:
            counts.pop(req_id, None)
            if acceptance is not None:
                acceptance.forget(req_id)
        drafts = scheduler_output.scheduled_spec_decode_tokens
        padded = scheduler_output.padded_spec_decode_req_ids
        last_batch = set(self._sampled_ids) if drafts else ()
        only_placeholders = self.placeholder_drafts
        sampled: dict[str, int] = {}
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests[req_id]
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk
            position = counts.get(req_id, request.num_output_tokens)
            num_new = 1
            num_drafts = drafts.get(req_id) if drafts else None
            if num_drafts and (req_id in last_batch or not (only_placeholders
                                                           or req_id in padded)):
                num_new += acceptance.num_accepted(req_id, position, num_drafts)
            sampled[req_id] = num_new
            counts[req_id] = position + num_new
        self._sampled_ids = list(sampled)
        done: set[str] = set()
        failed: dict[str, list[int]] = {}
        connector = self.connector
        if connector is not None:
            connector.set_virtual_time(ended_s)  # loads DyntraLB prefetches start now
            done = connector.finished_recving(ended_s)
            if done:
                failed = connector.take_failed()
        return ModelRunnerOutput(sampled, ended_s, done, failed)

    def take_draft_token_ids(self) -> list[str]:
        """The requests the drafter proposed k drafts for in the last forward (those that
        sampled); synchronous scheduling hands them to the scheduler after each step."""
        return self._sampled_ids

    def num_tokens(self, request) -> int:
        """The request's prompt and output tokens as the worker has them (the step cost
        reads them): the scheduler's count plus, under async scheduling, the tokens of
        the step whose output it has not processed yet."""
        return request.prompt_tokens + self._num_sampled.get(request.request_id,
                                                             request.num_output_tokens)
