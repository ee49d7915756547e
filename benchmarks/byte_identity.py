"""This checkout's outputs against a baseline checkout's, byte for byte: a change made
for speed must not change what a run writes.

For every workload (the bundled ones at the CLI's default dp 4, and vllm-ascend PR
#12292's workload with ``benchmarks/pr12292.py``'s settings at dp 8), impl (kit,
vllm-ascend) and transport (thread, process), both checkouts run ``dyntra-emu run``
into directories of their own (each checkout's code in its own environments:
``.venv``, ``.venv-upstream`` for vllm-ascend), and this script compares:

- every rank's event log, byte for byte: what ``dyntra-emu events RUN --rank r`` of the
  side whose runs hold Parquet records prints, or its ``rank<r>.events.jsonl`` (a
  checkout from before the records were Parquet);
- every ``rank<r>.log``, byte for byte;
- ``metrics.json`` without its ``wall`` section (wall-clock seconds), byte for byte
  once the section is taken out;

and for each bundled workload, ``dyntra-emu diff`` of the kit against vllm-ascend (its
``diff.json``, byte for byte but for the run directories it names). It prints one line
per comparison and a count, and exits 1 if anything differs.

    .venv-upstream/bin/python benchmarks/byte_identity.py --baseline ../h42-baseline
    .venv-upstream/bin/python benchmarks/byte_identity.py --baseline ../h42-baseline \\
        --workloads default recipe:pr12292 --impl kit --transport thread

``--keep DIR`` keeps the runs there and reuses a checkout's run found there (the
baseline's do not change between two calls).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUNDLED = ("default", "uniform", "longtail", "bimodal")
PR = "recipe:pr12292"
PR_FLAGS = ("--workload", "recipe:pr12292,n=1000,rate=400", "--dp", "8", "--block-size",
            "2048", "--max-concurrency", "128", "--cost-model", "kv-token-mtp3")
DEFAULT_TREE = ROOT.parent / "shared" / "upstream" / "vllm-ascend"


def workload_flags(workload: str) -> tuple[str, ...]:
    return PR_FLAGS if workload == PR else ("--workload", workload)


def command(checkout: pathlib.Path, impl: str, tree: pathlib.Path, argv: list[str]) -> list[str]:
    env = ".venv" if impl == "kit" else ".venv-upstream"
    return [str(checkout / env / "bin" / "python"), "-m", "emu", *argv,
            *(["--vllm-ascend", str(tree)] if impl != "kit" else [])]


def produce(checkout: pathlib.Path, argv: list[str], impl: str, tree: pathlib.Path,
            out: pathlib.Path, done_marker: str) -> None:
    """Run ``dyntra-emu argv --out out`` in ``checkout`` unless ``out`` holds its
    finished output already (``done_marker``)."""
    if (out / done_marker).exists():
        return
    if out.exists():
        shutil.rmtree(out)
    proc = subprocess.run(command(checkout, impl, tree, [*argv, "--out", str(out), "--quiet"]),
                          cwd=checkout, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if not (out / done_marker).exists():
        sys.exit(f"byte_identity.py: {checkout}: {' '.join(argv)} exited {proc.returncode} "
                 f"without {done_marker}:\n{proc.stderr}")


def metrics_without_wall(path: pathlib.Path) -> dict:
    metrics = json.loads(path.read_text())
    metrics.pop("wall", None)
    return metrics


def differing_keys(a: dict, b: dict) -> list[str]:
    """The top-level keys of two metrics.json whose values differ (or that one lacks)."""
    return sorted(key for key in a.keys() | b.keys()
                  if json.dumps(a.get(key), sort_keys=True) != json.dumps(b.get(key),
                                                                          sort_keys=True))


def event_logs(run: pathlib.Path, checkout: pathlib.Path) -> dict[str, bytes]:
    """Each rank's event log by its old file name: ``rank<r>.events.jsonl`` where the run
    wrote one, else what ``dyntra-emu events`` of ``checkout`` prints."""
    logs = {p.name: p.read_bytes() for p in run.glob("rank*.events.jsonl")}
    if logs:
        return logs
    for p in run.glob("rank*.steps"):
        rank = p.name[len("rank"):-len(".steps")]
        logs[f"rank{rank}.events.jsonl"] = subprocess.run(
            [str(checkout / ".venv" / "bin" / "python"), "-m", "emu", "events", str(run),
             "--rank", rank], check=True, capture_output=True, cwd=checkout).stdout
    return logs


def compare_run(a: pathlib.Path, b: pathlib.Path, checkout_a: pathlib.Path,
                checkout_b: pathlib.Path) -> tuple[list[str], int]:
    """What differs between two run directories (empty: nothing), and the step records
    of ``a``."""
    files_a = {**event_logs(a, checkout_a),
               **{p.name: p.read_bytes() for p in a.glob("rank*.log")}}
    files_b = {**event_logs(b, checkout_b),
               **{p.name: p.read_bytes() for p in b.glob("rank*.log")}}
    names, other = sorted(files_a), sorted(files_b)
    problems = [] if names == other else [f"files {names} against {other}"]
    problems += [name for name in names if name in other and files_a[name] != files_b[name]]
    steps = sum(log.count(b'"kind":"step"') for name, log in files_a.items()
                if name.endswith(".events.jsonl"))
    keys = differing_keys(metrics_without_wall(a / "metrics.json"),
                          metrics_without_wall(b / "metrics.json"))
    if keys:
        # "config" alone: what produced the run is recorded differently (e.g. settings a
        # later main records), the run's figures are the same
        problems.append(f"metrics.json (without wall): {', '.join(keys)}")
    return problems, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=pathlib.Path, required=True)
    parser.add_argument("--workloads", nargs="+", default=[*BUNDLED, PR])
    parser.add_argument("--impl", nargs="+", default=["kit", "vllm-ascend"])
    parser.add_argument("--transport", nargs="+", default=["thread", "process"])
    parser.add_argument("--no-diff", action="store_true",
                        help="skip the diff comparisons (skipped too without vllm-ascend "
                             "among --impl)")
    parser.add_argument("--vllm-ascend", type=pathlib.Path, default=DEFAULT_TREE)
    parser.add_argument("--keep", type=pathlib.Path)
    args = parser.parse_args()
    checkouts = {"this": ROOT, "baseline": args.baseline.resolve()}
    root = args.keep or pathlib.Path(tempfile.mkdtemp(prefix="byte-identity-"))
    compared = differing = 0
    try:
        for workload in args.workloads:
            for impl in args.impl:
                for transport in args.transport:
                    name = f"{workload.replace(':', '-')}-{impl}-{transport}"
                    argv = ["run", *workload_flags(workload), "--impl", impl,
                            "--transport", transport]
                    outs = {side: root / side / name for side in checkouts}
                    for side, checkout in checkouts.items():
                        produce(checkout, argv, impl, args.vllm_ascend, outs[side],
                                "metrics.json")
                    problems, steps = compare_run(outs["this"], outs["baseline"],
                                                  checkouts["this"], checkouts["baseline"])
                    compared += 1
                    differing += bool(problems)
                    verdict = "DIFFERENT: " + ", ".join(problems) if problems else "identical"
                    print(f"{name}: {verdict} ({steps} step records)", flush=True)
            if workload == PR or args.no_diff or "vllm-ascend" not in args.impl:
                continue  # diff runs vllm-ascend beside the kit
            name = f"{workload}-diff"
            outs = {side: root / side / name for side in checkouts}
            for side, checkout in checkouts.items():
                produce(checkout, ["diff", "--workload", workload], "vllm-ascend",
                        args.vllm_ascend, outs[side], "diff.json")
            # The report names the run directories it compared: each checkout's own.
            same = (outs["this"] / "diff.json").read_text().replace(str(outs["this"]), "OUT") \
                == (outs["baseline"] / "diff.json").read_text().replace(str(outs["baseline"]),
                                                                       "OUT")
            verdict = json.loads((outs["this"] / "diff.json").read_text()).get("identical")
            compared += 1
            differing += not same
            print(f"{name}: diff.json {'identical' if same else 'DIFFERENT'} (kit against "
                  f"vllm-ascend: identical={verdict})", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{compared} comparisons, {differing} differing")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
