"""Speculative decoding (MTP) in virtual time: which draft tokens the target accepts.

No model runs, so no draft is really checked. A profile with ``num_speculative_tokens``
k > 0 (``emu.rank.costs``) makes the scheduler verify k drafts per decoding request per
step -- the kit's (``emu.impl.kit.scheduler``) or vLLM's, whose drafts the emulated worker
proposes (``emu.impl.vllm_ascend.sampler``) -- and ``DraftAcceptance`` decides, for both,
how many of them are accepted: the draft at output position p is accepted when a hash of
(run seed, request id, p) falls under the profile's ``draft_acceptance_rate``, and a step
accepts the drafts up to the first rejected one (as rejection sampling does: a later
draft is conditioned on the earlier ones). The decision depends on nothing else, so it
is the same on every transport, thread interleaving, rank count and implementation, and
replaying a run gives the same tokens.
"""

from __future__ import annotations

import zlib

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a well-spread 64-bit hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class DraftAcceptance:
    """The acceptance rule of one run; the scheduler asks it once per decoding request
    per step (``num_accepted``) after the forward."""

    def __init__(self, num_speculative_tokens: int, acceptance_rate: float, seed: int):
        if num_speculative_tokens < 1:
            raise ValueError("DraftAcceptance needs num_speculative_tokens >= 1")
        self.num_speculative_tokens = num_speculative_tokens
        # Accept when the 64-bit hash is below this: rate 1 accepts every draft
        # (2**64 is above every hash), rate 0 none.
        self._threshold = int(round(acceptance_rate * (1 << 64)))
        self._seed = seed
        self._keys: dict[str, int] = {}

    @classmethod
    def for_profile(cls, profile, seed: int) -> DraftAcceptance | None:
        """The rule of a cost profile, or None for a profile without drafts (the
        scheduler then runs plain decode)."""
        if not profile.num_speculative_tokens:
            return None
        return cls(profile.num_speculative_tokens, profile.draft_acceptance_rate, seed)

    def _key(self, request_id: str) -> int:
        key = self._keys.get(request_id)
        if key is None:
            key = _mix64((self._seed << 32) ^ zlib.crc32(request_id.encode()))
            self._keys[request_id] = key
        return key

    def accepted(self, request_id: str, position: int) -> bool:
        """Whether the draft token at output position ``position`` (0-based) of the
        request is accepted, its earlier drafts having been accepted."""
        return _mix64(self._key(request_id) ^ (position * 0xD1B54A32D192ED03 & _MASK)) \
            < self._threshold

    def num_accepted(self, request_id: str, first_position: int, num_drafts: int) -> int:
        """How many of ``num_drafts`` drafts, at output positions ``first_position``
        onwards, the target accepts: the length of the accepted prefix."""
        n = 0
        while n < num_drafts and self.accepted(request_id, first_position + n):
            n += 1
        return n

    def forget(self, request_id: str) -> None:
        """The request finished: drop its cached key."""
        self._keys.pop(request_id, None)
