"""The output directory of a command: created, or refused when it holds an earlier run.

`run`, `ab`, `diff` and `sweep` write into ``--out DIR`` (default runs/<date>-<time>-<command>).
An earlier run's files are never mixed with a new run's: they are refused, or with
--overwrite removed first (exactly the files a run writes, nothing else, and never
through a symbolic link: docs/security.md).
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

from emu.cli.errors import UsageError

# Files a run leaves in its directory; --overwrite removes exactly these.
# (rank*.events.jsonl and rank*.wall.jsonl: the JSON Lines logs of earlier versions.)
RUN_FILES = ("run.json", "rank*.steps", "rank*.requests",
             "rank*.wall", "rank*.progress.jsonl", "rank*.events.jsonl",
             "rank*.wall.jsonl", "rank*.log", "metrics.json",
              "summary.md", "error.txt", "load.png", "bubble.png", "tpot.png",
              "load_ab.png", "bubble_ab.png", "tpot_ab.png", "load_diff.png", "diff.json",
              "ab.json", "timeline.json")


def _default_out_dir(command: str) -> Path:
    """runs/<timestamp>-<command> under the current directory, never an existing one."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{stamp}-{command}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _existing_run_files(directory: Path) -> list[Path]:
    return sorted(p for pattern in RUN_FILES for p in directory.glob(pattern))


def _first_link(out: Path, subdir: str) -> Path | None:
    """The first component of out/subdir that is a symbolic link, if any."""
    path = out
    for part in Path(subdir).parts:
        path = path / part
        if path.is_symlink():
            return path
    return None


def out_dir_path(value: str | None, command: str) -> Path:
    """Where a command writes: ``--out DIR``, or runs/<date>-<time>-<command>. Nothing
    is created (``prepare_out_dir`` does that once the inputs are checked)."""
    return _default_out_dir(command) if value is None else Path(value)


def prepare_out_dir(out: Path, overwrite: bool, subdirs: tuple[str, ...] = ()) -> Path:
    """Create the output directory ``out`` (and ``subdirs`` in it). An existing
    directory that holds a previous run's files is refused unless --overwrite, which
    deletes exactly those files (so stale rank logs of a larger DP size can never mix
    into this run). No symbolic link inside the directory is followed: one named like a
    run file, or standing where a run's subdirectory goes, counts as an earlier run's and
    --overwrite removes the link."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    links = {s: link for s in subdirs if (link := _first_link(out, s)) is not None}
    dirs = [out, *(out / s for s in subdirs if s not in links)]
    stale = [*sorted(set(links.values())),
             *(p for d in dirs if d.is_dir() for p in _existing_run_files(d))]
    if stale and not overwrite:
        shown = ", ".join(str(p.relative_to(out)) for p in stale[:3])
        more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
        raise UsageError(f"--out {out}: already holds a run ({shown}{more}); choose a new "
                         "directory or pass --overwrite to replace it")
    _make_dirs(out, dirs)
    for p in stale:
        if p.is_dir() and not p.is_symlink():  # a record table's parts
            shutil.rmtree(p)
        else:
            p.unlink()
    _make_dirs(out, [out / s for s in links])
    return out


def _make_dirs(out: Path, dirs: list[Path]) -> None:
    try:
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create the directory: "
                         f"{exc.strerror or exc}") from None
