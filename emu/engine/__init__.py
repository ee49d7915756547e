"""One rank's engine: the loop in vLLM's three methods (``core``), the lockstep
clock, the step-cost profiles, arrivals, the event and wall logs, strict invariants."""
