"""`dyntra-emu explain`: the planner's decision trace for one snapshot, round by round.

The snapshot comes from a diagnostics log (``explain LOG --index N``, numbered as
``replay`` lists them) or is typed in as JSON (``--snapshot``); the trace and its text
are ``emu.offline.explain``.
"""

from __future__ import annotations

import argparse
import json
import sys

from dyntra_lb.planner import registry as planners
from emu.cli.replay import add_planner_options, emit, positive_int
from emu.knobs import is_int
from emu.offline.explain import InputError, from_log, plan_text, render, trace
from emu.offline.replay import DEFAULT_THRESHOLD


def parse_snapshot(text: str) -> list[tuple[list[int], int]]:
    """--snapshot's JSON: one [blks, split] per rank."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--snapshot is not valid JSON: {exc}") from None

    if not isinstance(value, list) or not value:
        raise InputError("--snapshot must be a non-empty JSON list with one [blks, split] "
                         "per rank, e.g. '[[[5,3,9],2],[[4],1]]'")
    snapshot = []
    for rank, entry in enumerate(value):
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], list)
                or not all(is_int(b) and b >= 0 for b in entry[0])
                or not is_int(entry[1]) or entry[1] < 0):
            raise InputError(f"--snapshot rank {rank}: expected [blks, split] with block "
                             f"counts >= 0 and split >= 0, got {json.dumps(entry)}")
        snapshot.append((list(entry[0]), entry[1]))
    return snapshot


def _snapshot(args) -> tuple[list, int, str, float, object, list[dict] | None, list[str]]:
    """The snapshot the flags name, its DP size, title, threshold, max_num_seqs, logged
    plans and notes; raises InputError."""
    if (args.log is None) == (args.snapshot is None):
        raise InputError("give either LOG with --index, or --snapshot")
    if args.log is not None:
        if args.index is None:
            raise InputError("LOG needs --index N (snapshots are numbered as "
                             "`dyntra-emu replay` lists them, from 0)")
        if args.dp is not None:
            raise InputError("--dp only goes with --snapshot (a log's tables give it)")
        snapshot, title, threshold, max_num_seqs, logged, notes = from_log(
            args.log, args.index, threshold=args.threshold, max_num_seqs=args.max_num_seqs)
        return snapshot, len(snapshot), title, threshold, max_num_seqs, logged, notes
    if args.index is not None:
        raise InputError("--index only goes with LOG")
    snapshot = parse_snapshot(args.snapshot)
    dp = len(snapshot) if args.dp is None else args.dp
    if dp < len(snapshot):
        raise InputError(f"--dp {dp} is smaller than the {len(snapshot)} ranks in --snapshot")
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    return (snapshot, dp, "snapshot from --snapshot", threshold, args.max_num_seqs, None,
            [])


def cmd_explain(args: argparse.Namespace) -> int:
    """Exit code 0, or 2 for bad input (message on stderr)."""
    try:
        snapshot, dp, title, threshold, max_num_seqs, logged, notes = _snapshot(args)
    except InputError as exc:
        print(f"dyntra-emu explain: {exc}", file=sys.stderr)
        return 2
    try:
        events, plans = trace(snapshot, dp, max_num_seqs=max_num_seqs, threshold=threshold,
                              planner=args.planner)
    except ValueError as exc:  # the planner rejects the snapshot (e.g. beyond int32)
        print(f"dyntra-emu explain: the planner rejects this snapshot: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit(json.dumps({"requests_by_rank": [[b, s] for b, s in snapshot], "dp": dp,
                         "planner": args.planner,
                         "threshold": threshold, "max_num_seqs": max_num_seqs,
                         "events": events, "plans": plans, "logged_plans": logged},
                        indent=1))
        return 0
    if args.planner != planners.REFERENCE:
        notes.append(f"planner={args.planner} (--planner)")
    lines = [title, *notes, render(events, threshold=threshold, max_num_seqs=max_num_seqs)]
    if logged is not None:
        same = logged == plans
        lines.append("logged plan: " + ("the same" if same else "DIFFERENT"))
        if not same:
            lines.extend(plan_text(r, p) for r, p in enumerate(logged))
    emit("\n".join(lines))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``explain`` on the ``dyntra-emu`` sub-command parser."""
    parser = subparsers.add_parser(
        "explain", help="print the planner's decision trace for one snapshot",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", default=None,
                        help="diagnostics log to take the snapshot from (with --index)")
    parser.add_argument("--index", type=int, default=None,
                        help="which snapshot of LOG, numbered from 0 as `replay` lists them")
    parser.add_argument("--snapshot", default=None,
                        help="requests_by_rank as JSON, one [blks, split] per rank, e.g. "
                             "'[[[5,3,9],2],[[4],1]]'")
    parser.add_argument("--dp", type=positive_int, default=None,
                        help="number of DP ranks for --snapshot (default: its length)")
    add_planner_options(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the observer events and plans as JSON")
    parser.set_defaults(func=cmd_explain)
    return parser
