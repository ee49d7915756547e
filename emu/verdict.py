"""Whether DyntraLB is worth it on a workload, and at what tail cost: the closing verdict
of ``dyntra-emu ab`` (DyntraLB off against on) and the rule by which ``dyntra-emu tune``
recommends a config or "keep DyntraLB off".

The rule: a config is worth it when its throughput gain over DyntraLB off is at least
``min_gain`` percent (``--min-gain``, default ``DEFAULT_MIN_GAIN_PCT``) and, measured over
several seeds, the 95 % CI of that gain lies above 0. The tail cost (TPOT p99 against
DyntraLB off's, the longest pause) is quoted next to the gain either way: the gain alone
hides requests paused for seconds.

Why 1 % by default: below it a gain is within what the repo measured as noise and
model error. At 3 seeds of PR #12292's recipe (n=200) every tuned config's mean stayed
within ±1 % of DyntraLB off (benchmarks/RESULTS.md, "Tune against a grid"), and the
bundled cost profiles disagree with each other by more than that on the same A/B
("PR #12292's A/B, emulated": +0.50 to +3.46 % for one seed). A gain the emulator cannot
tell from those is not worth TPOT tails and pauses on a real node. ``--min-gain 0``
accepts any gain.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MIN_GAIN_PCT = 1.0


@dataclass(frozen=True)
class Tail:
    """What the gain costs: TPOT p99 with DyntraLB off and on (ms), and the longest time
    one request spent paused (ms)."""

    tpot_p99_off_ms: float | None
    tpot_p99_on_ms: float | None
    longest_pause_ms: float | None

    def text(self) -> str:
        parts = []
        off, on = self.tpot_p99_off_ms, self.tpot_p99_on_ms
        if off is not None and on is not None:
            ratio = f" ({on / off:.2f}x DyntraLB off's)" if off else ""
            parts.append(f"TPOT p99 {off:.1f} -> {on:.1f} ms{ratio}")
        if self.longest_pause_ms is not None:
            pause = self.longest_pause_ms
            parts.append("no request paused" if pause == 0
                         else f"a request paused {pause / 1e3:.1f} s in total at most")
        return ", ".join(parts) if parts else "tail not measured"


def worth_it(gain_pct: float, ci_pct: float | None, min_gain: float) -> bool:
    """The rule of the module docstring (``ci_pct``: the gain's 95 % half-width over the
    seeds, None for one run)."""
    return gain_pct >= min_gain and (ci_pct is None or gain_pct - ci_pct > 0)


def verdict_line(gain_pct: float, ci_pct: float | None, min_gain: float, tail: Tail,
                 seeds: int = 1, samples: str = "seeds") -> str:
    """``ab``'s closing line: worth it or keep DyntraLB off, the gain and the tail cost;
    the gain over ``seeds`` samples, which are ``samples`` (seeds, or ``ab --split``'s
    windows of one trace)."""
    gain = f"{gain_pct:+.2f} %" if ci_pct is None else f"{gain_pct:+.2f} ± {ci_pct:.2f} %"
    over = "" if seeds == 1 else f" over {seeds} {samples}"
    if worth_it(gain_pct, ci_pct, min_gain):
        return (f"Verdict: worth it: throughput {gain}{over} over DyntraLB off (at least "
                f"--min-gain {min_gain:g} %), at a tail cost of {tail.text()}.")
    why = (f"below --min-gain {min_gain:g} %" if gain_pct < min_gain
           else "its 95 % CI reaches 0")
    return (f"Verdict: keep DyntraLB off: throughput {gain}{over}, {why}; the tail cost "
            f"would be {tail.text()}.")
