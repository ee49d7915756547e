"""`run.json`: whether the run in an output directory finished.

`emu.run.run_cluster` writes it with state "running" before any rank starts and
rewrites it when the launch ends: "complete", "failed" (a rank failed, the run timed
out or hung) or "interrupted" (SIGINT / SIGTERM to the launching process). A launcher
killed with SIGKILL leaves "running" behind. Readers of the directory
(`emu.metrics.load_run`, `dyntra-emu replay` / `explain`) call `read_status` so that
the partial event logs of an unfinished run are never taken for a whole run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STATUS_FILE = "run.json"
STATES = ("running", "complete", "failed", "interrupted")


def write_status(out_dir, state: str, **fields) -> None:
    """Replace `out_dir/run.json` atomically with `state` and `fields` (JSON-ready), plus
    the launching process's pid and the wall-clock time."""
    if state not in STATES:
        raise ValueError(f"run state must be one of {list(STATES)}, got {state!r}")
    path = Path(out_dir) / STATUS_FILE
    record = {"state": state, "pid": os.getpid(), "time": time.strftime(
        "%Y-%m-%dT%H:%M:%S%z"), **fields}
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_status(out_dir) -> dict | None:
    """The parsed `run.json` of `out_dir`, or None when there is none (a directory
    written before run.json existed, or by hand). An unreadable file reads as
    {"state": "unknown", "problem": ...}."""
    path = Path(out_dir) / STATUS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return {"state": "unknown", "problem": f"cannot read {path}: {exc}"}
    try:
        record = json.loads(text)
    except ValueError as exc:
        return {"state": "unknown", "problem": f"{path} is not valid JSON: {exc}"}
    if not isinstance(record, dict) or record.get("state") not in STATES:
        return {"state": "unknown", "problem": f"{path} has no known state"}
    return record


def describe_unfinished(out_dir, status: dict) -> str:
    """One sentence on why the run in `out_dir` is not complete."""
    state = status.get("state")
    if state == "running":
        return (f"{out_dir}: the run has not finished ({STATUS_FILE} says 'running': it is "
                f"still running, or its launcher (pid {status.get('pid')}) was killed)")
    if state == "unknown":
        return f"{out_dir}: cannot tell whether the run finished: {status.get('problem')}"
    reason = status.get("reason")
    return (f"{out_dir}: the run did not finish ({STATUS_FILE} says {state!r}"
            f"{': ' + reason if reason else ''})")


def unfinished_note(log_path) -> str | None:
    """For offline tools reading one file of a run directory (a rank's log): a warning
    when the directory's run.json says the run did not finish, else None."""
    directory = Path(log_path).parent
    status = read_status(directory)
    if status is None or status.get("state") == "complete":
        return None
    return (f"warning: {describe_unfinished(directory, status)}; {Path(log_path).name} "
            "is partial")
