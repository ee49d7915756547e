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

import numpy as np

_MASK = (1 << 64) - 1
# SplitMix64's constants: the increment, the two multipliers; and the position's.
_GAMMA, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_POSITION = 0xD1B54A32D192ED03
# A request's decisions are computed this many positions at a time, at least.
_CHUNK = 256


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a well-spread 64-bit hash of a 64-bit integer."""
    x = (x + _GAMMA) & _MASK
    x = ((x ^ (x >> 30)) * _M1) & _MASK
    x = ((x ^ (x >> 27)) * _M2) & _MASK
    return x ^ (x >> 31)


def _mix64_array(x: np.ndarray) -> np.ndarray:
    """``_mix64`` of every element of a uint64 array (numpy's uint64 arithmetic wraps
    modulo 2**64, as ``_mix64`` masks)."""
    x = x + np.uint64(_GAMMA)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


class DraftAcceptance:
    """The acceptance rule of one run; the scheduler asks it once per decoding request
    per step (``num_accepted``) after the forward.

    A request's decisions are computed a chunk of positions at a time with numpy (one
    call for hundreds of positions instead of a Python hash per draft) and kept as bytes,
    1 for an accepted draft, until the request finishes (``forget``)."""

    def __init__(self, num_speculative_tokens: int, acceptance_rate: float, seed: int):
        if num_speculative_tokens < 1:
            raise ValueError("DraftAcceptance needs num_speculative_tokens >= 1")
        self.num_speculative_tokens = num_speculative_tokens
        # Accept when the 64-bit hash is below this: rate 1 accepts every draft
        # (2**64 is above every hash), rate 0 none.
        self._threshold = int(round(acceptance_rate * (1 << 64)))
        self._seed = seed
        self._decisions: dict[str, bytes] = {}

    @classmethod
    def for_profile(cls, profile, seed: int) -> DraftAcceptance | None:
        """The rule of a cost profile, or None for a profile without drafts (the
        scheduler then runs plain decode)."""
        if not profile.num_speculative_tokens:
            return None
        return cls(profile.num_speculative_tokens, profile.draft_acceptance_rate, seed)

    def _decided(self, request_id: str, stop: int) -> bytes:
        """The request's decisions for positions 0 .. at least ``stop`` - 1."""
        decided = self._decisions.get(request_id, b"")
        if len(decided) >= stop:
            return decided
        key = _mix64((self._seed << 32) ^ zlib.crc32(request_id.encode()))
        positions = np.arange(len(decided), max(stop, 2 * len(decided), _CHUNK),
                              dtype=np.uint64)
        hashes = _mix64_array(np.uint64(key) ^ (positions * np.uint64(_POSITION)))
        if self._threshold > _MASK:
            accepted = np.ones(len(positions), dtype=bool)
        else:
            accepted = hashes < np.uint64(self._threshold)
        decided += accepted.tobytes()
        self._decisions[request_id] = decided
        return decided

    def accepted(self, request_id: str, position: int) -> bool:
        """Whether the draft token at output position ``position`` (0-based) of the
        request is accepted, its earlier drafts having been accepted: the 64-bit hash
        of (seed, request, position) below the rate's share of 2**64."""
        return self._decided(request_id, position + 1)[position] == 1

    def num_accepted(self, request_id: str, first_position: int, num_drafts: int) -> int:
        """How many of ``num_drafts`` drafts, at output positions ``first_position``
        onwards, the target accepts: the length of the accepted prefix."""
        stop = first_position + num_drafts
        rejected = self._decided(request_id, stop).find(0, first_position, stop)
        return num_drafts if rejected < 0 else rejected - first_position

    def forget(self, request_id: str) -> None:
        """The request finished: drop its decisions."""
        self._decisions.pop(request_id, None)
