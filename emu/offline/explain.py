"""`dyntra-emu explain`: why the planner made the plan it made, round by round.

For a contributor asking "why was this request paused?" about one snapshot: one taken
from a diagnostics log (``explain LOG --index N``, numbered as ``replay`` lists them) or
typed in as JSON (``explain --snapshot '[[[5,3,9],2],[[4],1]]' --dp 2``). The planner
runs once with an observer attached, and every line of the trace is one of the decision
events ``dyntra_lb.planner.front.balance_load`` reports (its module docstring lists them): the
fill, each round's loads and bubble, the swap searched on the least and on the most
loaded card with the distances compared, the throughput drop with the modelled
throughputs, why the loop stopped, the cancellations, and the final plan. Nothing here
decides anything; the only state kept is the list of block counts per rank, moved as the
events say, to show which requests each card holds.
"""

from __future__ import annotations

import copy
import json
from collections import Counter

from dyntra_lb.planner import registry as planners
from dyntra_lb.planner.front import THROUGHPUT_FIXED, THROUGHPUT_PER_BLOCK
from emu.offline.logscan import read_log
from emu.offline.replay import DEFAULT_THRESHOLD
from emu.run_status import unfinished_note


def trace(requests_by_rank, dp_size: int, *, max_num_seqs=None, threshold=DEFAULT_THRESHOLD,
          planner: str = planners.REFERENCE):
    """Run planner ``planner`` of ``dyntra_lb.planner.registry`` (default: the reference,
    production's) with an observer; returns ``(events, plans)`` with the plans as dicts."""
    events = []
    plans = planners.get(planner)(requests_by_rank, dp_size, max_num_seqs=max_num_seqs,
                                  threshold=threshold,
                                  observer=lambda e: events.append(copy.deepcopy(e)))
    return events, [p.to_dict() for p in plans]


# --- rendering ---------------------------------------------------------------------------


def _num(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def _items(items) -> str:
    return "[" + ", ".join(f"{v}*" if newly else str(v) for v, newly in items) + "]"


class _Cards:
    """Block counts held by each rank while the planner works, as (size, newly_added)
    in the planner's list order. Only moved as the events say (fill, swaps, drops), to display."""

    def __init__(self, parsed: dict) -> None:
        self.running = {c["rank"]: [(v, False) for v in c["running"]] for c in parsed["cards"]}
        self.waiting = {c["rank"]: [(v, False) for v in c["waiting"]] for c in parsed["cards"]}
        self.lost = False  # set if the lists stop matching the events: then they are hidden

    def move(self, e) -> None:
        if self.lost:
            return
        try:
            {"fill": self.fill, "swap": self.swap, "drop": self.drop}[e["kind"]](e)
        except LookupError:
            self.lost = True

    def totals_match(self, tot_blk) -> bool:
        self.lost = self.lost or tot_blk != [sum(v for v, _ in self.running[r])
                                             for r in range(len(tot_blk))]
        return not self.lost

    @staticmethod
    def _take(items, size, newly=None):
        for i, (v, n) in enumerate(items):
            if v == size and (newly is None or n == newly):
                return items.pop(i)
        raise LookupError(size)

    def fill(self, e) -> None:
        self.waiting[e["rank"]].pop(0)
        self.running[e["rank"]].append((e["blk"], True))

    def swap(self, e) -> None:
        run, wait = self.running[e["rank"]], self.waiting[e["rank"]]
        out = self._take(run, e["out_blk"], e["newly_added"])
        incoming = self._take(wait, e["in_blk"])
        run.append(incoming)
        wait.append(out)

    def drop(self, e) -> None:
        run = self.running[e["rank"]]
        # the tie rule only ever picks a newly added item; otherwise the first of its size
        item = self._take(run, e["blk"], True if e["tie_rule"] else None)
        self.waiting[e["rank"]].append(item)

    def line(self, rank: int) -> str:
        run = self.running[rank]
        return (f"running {_items(run)} = {_blocks(sum(v for v, _ in run))}, "
                f"waiting {_items(self.waiting[rank])}")

    def why_no_swap(self, rank: int, mode: str) -> str:
        if not self.waiting[rank]:
            return "it has no waiting request"
        if not self.running[rank]:
            return "it has no running request"
        bigger = "larger" if mode == "increase" else "smaller"
        return (f"no waiting request {bigger} than a running one brings its total closer "
                f"to the average")


def _swap_text(e) -> str:
    newly = " (newly added)" if e["newly_added"] else ""
    text = (f"{e['mode']} swap: pause {e['out_blk']}{newly}, admit "
            f"{e['in_blk']}; distance from the average {_num(e['dist_before'])} -> "
            f"{_num(e['dist_after'])}; DP{e['rank']} now {e['tot_blk']} blocks")
    if e["tie_rule"]:
        text += ("\n      taken by the tie rule (Swap search): at equal distance a newly added "
                 "running item wins" + (", even with zero gain (quirk Q4, docs/protocol.md)"
                                        if e["dist_before"] == e["dist_after"] else ""))
    return text


def plan_text(rank: int, plan: dict) -> str:
    what = []
    for v in plan["out_blk"]:
        what.append(f"pauses a running request of {_blocks(v)}")
    for v in plan["in_blk"]:
        what.append(f"admits a waiting request of {_blocks(v)}")
    what.append("admits nothing else" if plan["in_blk"] or plan["out_blk"]
                else "pauses nothing and admits nothing")
    return (f"  DP{rank}  out={plan['out_blk']} in={plan['in_blk']} "
            f"freeze={plan['freeze']}: " + "; ".join(what))


def render(events: list[dict], *, threshold: float, max_num_seqs) -> str:
    """The decision trace as text, from the observer events of one planner call."""
    out = []
    marks = []  # (index in out, round number) where a round starts; None: the stop line
    cards = None
    order_now: list[int] = []
    tots: list = []
    searched = set()  # what the current round has searched so far

    def close_round(next_kind: str) -> None:
        """Name the searches the round made without a result, seen from the next event:
        a decrease swap, a drop or a new round means the searches before it came up
        empty (docs/planner.md, "Main loop": increase on the least loaded card, then
        decrease on the most)."""
        if not order_now:
            return
        if "increase" not in searched and next_kind in ("swap_decrease", "drop"):
            low = order_now[-1]
            hint = f" ({cards.why_no_swap(low, 'increase')})" if not cards.lost else ""
            out.append(f"  least loaded DP{low}: no increase swap{hint}")
            searched.add("increase")
        if "decrease" not in searched and next_kind in ("drop", "round"):
            high = order_now[0]
            hint = f" ({cards.why_no_swap(high, 'decrease')})" if not cards.lost else ""
            out.append(f"  most loaded DP{high}: no decrease swap{hint}")
            searched.add("decrease")

    for e in events:
        kind = e["kind"]
        if kind == "parsed":
            cards = _Cards(e)
            metric = ("ratio: bubble = (max - avg) / max" if threshold < 1
                      else "absolute: bubble = max - avg, in blocks")
            out.append(f"planner trace: dp={len(e['cards'])}, max_num_seqs={max_num_seqs}, "
                       f"threshold={threshold} ({metric}); (names) are docs/planner.md's "
                       "sections")
            out.append("input (Input and parsing; later, * marks items the fill step moved to "
                       "running, the planner's newly added ones):")
            out.extend(f"  DP{c['rank']}  {cards.line(c['rank'])}" for c in e["cards"])
        elif kind == "fill":
            if not any(line.startswith("fill") for line in out):
                out.append(f"fill (Fill step): free running slots (below max_num_seqs="
                           f"{max_num_seqs}) take the head of the waiting list")
            cards.move(e)
            out.append(f"  DP{e['rank']} admits {e['blk']} -> {e['tot_blk']} blocks")
        elif kind == "round":
            close_round("round")
            marks.append((len(out), e["round"]))
            searched.clear()
            order_now[:] = e["order"]
            tots = list(e["tot_blk"])
            cards.totals_match(tots)
            loads = ", ".join(f"DP{r} {tots[r]}" for r in e["order"])
            verdict = ("below the threshold: stop" if e["bubble"] < threshold
                       else f">= threshold {threshold}: balance")
            out.append(f"round {e['round']} (Main loop): loads {loads} (most loaded first); "
                       f"avg {_num(e['avg'])}; bubble {_num(e['bubble'])} {verdict}")
            if not cards.lost and e["bubble"] >= threshold:
                out.extend(f"    DP{r}  {cards.line(r)}" for r in e["order"])
            if e["bubble"] < threshold:
                order_now.clear()
        elif kind == "swap":
            if e["mode"] == "decrease":
                close_round("swap_decrease")
            searched.add(e["mode"])
            who = "least" if e["mode"] == "increase" else "most"
            cards.move(e)
            tots[e["rank"]] = e["tot_blk"]
            if e["mode"] == "increase":
                # the cards are re-sorted (stable, largest first) before the decrease search
                order_now[:] = sorted(order_now, key=lambda r: -tots[r])
            out.append(f"  {who} loaded DP{e['rank']}: {_swap_text(e)}")
        elif kind in ("drop", "no_drop"):
            close_round("drop")
            fixed, per = THROUGHPUT_FIXED, THROUGHPUT_PER_BLOCK
            out.append(f"  no swap this round -> throughput drop on the most loaded DP"
                       f"{e['rank']} (Throughput-drop heuristic: modelled throughput = "
                       f"running requests / ({fixed} + {per} * largest load))")
            if kind == "drop":
                cards.move(e)
                tots[e["rank"]] = e["tot_blk"]
                tie = (" (tie rule: equal throughput, the newly added item wins)"
                       if e["tie_rule"] else "")
                out.append(f"    pause {e['blk']}: throughput {_num(e['throughput_before'])}"
                           f" -> {_num(e['throughput_after'])}{tie}; DP{e['rank']} now "
                           f"{e['tot_blk']} blocks")
            elif e["throughput"] is None:
                out.append("    nothing to drop: at most one request runs in total")
            else:
                out.append(f"    nothing to drop: no pause raises the throughput "
                           f"{_num(e['throughput'])}")
        elif kind == "stop":
            marks.append((len(out), None))
            reason = e["reason"]
            if reason == "no_progress":
                text = f"round {e['round']} changed nothing"
            elif reason == "bubble_below_threshold":
                text = f"bubble {_num(e['bubble'])} < threshold {threshold}"
            else:
                text = (f"max_iters reached after {e['round']} productive rounds (the "
                        f"plan depends on where the oscillation stopped, quirk Q4)")
            out.append(f"stop: {text}")
            order_now.clear()
        elif kind == "cancel":
            if not any(line.startswith("cancellation") for line in out):
                out.append("cancellation (Cancellation): an admitted size that is also paused on "
                           "the same rank cancels both")
            out.append(f"  DP{e['rank']}: cancelled {_values(e['cancelled'])} -> "
                       f"out={e['out_blk']} in={e['in_blk']}")
        elif kind == "plans":
            out.append("final plan (freeze = nothing to admit, Freeze):")
            out.extend(plan_text(r, p) for r, p in enumerate(e["plans"]))
        else:
            out.append(f"{kind}: {json.dumps(e, sort_keys=True)}")
    return "\n".join(_fold_repeated_rounds(out, marks))


def _fold_repeated_rounds(out: list[str], marks: list) -> list[str]:
    """Replace runs of rounds whose text repeats the round before them word for word
    (an oscillation, docs/protocol.md quirk Q4) by one line naming them."""
    if not marks:
        return list(out)
    folded = out[:marks[0][0]]
    previous, first_repeat, last_repeat = None, None, None
    for (start, rnd), (end, _) in zip(marks, marks[1:] + [(len(out), None)], strict=True):
        block = out[start:end]
        if rnd is None:  # the stop line and everything after it
            folded += _repeat_note(first_repeat, last_repeat, previous) + block
            break
        body = [block[0].replace(f"round {rnd} ", "round # ", 1), *block[1:]]
        if previous is not None and body == previous[1]:
            first_repeat = rnd if first_repeat is None else first_repeat
            last_repeat = rnd
            continue
        folded += _repeat_note(first_repeat, last_repeat, previous) + block
        previous, first_repeat, last_repeat = (rnd, body), None, None
    else:
        folded += _repeat_note(first_repeat, last_repeat, previous)
    return folded


def _repeat_note(first, last, previous) -> list[str]:
    if first is None:
        return []
    rounds = f"round {first}" if first == last else f"rounds {first} to {last}"
    return [f"{rounds}: the same as round {previous[0]}, line for line (not repeated)"]


def _values(values: list[int]) -> str:
    """A list of block counts, shortened to value x count when long."""
    if len(values) <= 12:
        return str(values)
    counts = Counter(values)
    return (f"{len(values)} values: "
            + ", ".join(f"{v} x{n}" for v, n in counts.items()))


# --- command line ------------------------------------------------------------------------


class InputError(ValueError):
    """Bad input for ``explain``; the message names the flag."""


def from_log(log: str, index: int, *, threshold: float | None, max_num_seqs: int | None
             ) -> tuple[list, str, float, object, list[dict] | None, list[str]]:
    """Snapshot ``index`` of the diagnostics log ``log`` (numbered as ``replay`` lists
    them) with what planning it needs: (requests_by_rank, title, threshold,
    max_num_seqs, the logged plans, notes on where each setting came from).
    ``threshold`` / ``max_num_seqs`` override the log's; raises InputError."""
    try:
        scan = read_log(log)
    except OSError as exc:
        raise InputError(f"cannot read {log}: {exc.strerror or exc}") from None
    count = len(scan.snapshots)
    if not 0 <= index < count:
        raise InputError(f"--index {index}: {log} has {count} snapshot(s)"
                         + (f" (0..{count - 1})" if count else ""))
    snap = scan.snapshots[index]
    if snap.requests_by_rank is None:
        raise InputError(f"--index {index}: snapshot at line {snap.line} cannot be "
                         f"used: {snap.problem}")
    note = unfinished_note(log)
    notes = [] if note is None else [note.replace("warning:", "WARNING:", 1)]
    if threshold is None:
        threshold = snap.threshold if snap.threshold is not None else DEFAULT_THRESHOLD
        notes.append(f"bubble_threshold={threshold} "
                     + (f"(log line {snap.threshold_line})" if snap.threshold is not None
                        else "(default; no config line in the log)"))
    if max_num_seqs is None:
        max_num_seqs = snap.max_num_seqs
        notes.append(f"max_num_seqs={max_num_seqs} (log line {snap.max_num_seqs_line})"
                     if max_num_seqs is not None else
                     "ASSUMPTION: max_num_seqs is not in the log; planning without the fill "
                     "step (Fill step). Pass --max-num-seqs if the plan should fill free slots")
    title = (f"snapshot {snap.index} of {log} (line {snap.line}, wave "
             f"{'-' if snap.wave is None else snap.wave}, step "
             f"{'-' if snap.step is None else snap.step})")
    return snap.requests_by_rank, title, threshold, max_num_seqs, snap.logged_plans, notes
