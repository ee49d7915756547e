"""What a request of a workload trace is: ``TraceRequest``, the fields a trace line may
hold and their limits, ``TraceError`` (every problem of a trace, each naming
``file:line``) and the engine's integer virtual microseconds (``arrival_us``)."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOKENS = 10_000_000
MAX_ARRIVAL_S = 1_000_000.0
MAX_PRIORITY = 2**31 - 1

REQUIRED_FIELDS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_FIELDS = ("rank", "priority", "prompt_text")

# How many problems a TraceError message lists before summarising the rest.
_MAX_LISTED_PROBLEMS = 20


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload trace, as the engine receives it."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    rank: int | None = None
    priority: int = 0
    prompt_text: str | None = field(default=None, compare=False, repr=False)


class TraceError(ValueError):
    """A trace (or its routing against a DP size) is invalid. `problems` holds every
    problem found, each naming `file:line`, the field and what was expected."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        shown = self.problems[:_MAX_LISTED_PROBLEMS]
        more = len(self.problems) - len(shown)
        if more:
            shown.append(f"... and {more} more problem(s)")
        super().__init__("\n".join(shown))


def arrival_us(req: TraceRequest) -> int:
    """Arrival time in the engine's integer virtual microseconds."""
    return round(req.arrival_s * 1e6)

