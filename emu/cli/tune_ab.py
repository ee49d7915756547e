"""``dyntra-emu tune``'s last steps: the recommendation's A/B against DyntraLB off on fresh
seeds (``run_ab``, as ``ab --seeds`` runs them) and the line on how sure the
recommendation is (``confidence``)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from emu.ab_seeds import write_ab_json
from emu.cli.batch import run_batch
from emu.cli.progress import note
from emu.cli.split import split_confidence
from emu.recipes import seed_summary
from emu.spec import check
from emu.sweep import with_lb
from emu.tune import spec_fields


def run_ab(args, executor, bases, seeds, base_config: dict, best: dict, out_dir: Path) -> dict:
    """The recommendation against DyntraLB off on fresh seeds, as ``ab --seeds`` runs
    them: ``ab/seed<s>/a`` and ``b``, and ``ab/ab.json``."""
    ab_dir = out_dir / "ab"
    if ab_dir.is_dir() and not ab_dir.is_symlink():
        shutil.rmtree(ab_dir)
    keys, fields = spec_fields(best["values"])
    configs = ((with_lb(base_config, enabled=False), {}),
               (with_lb(base_config, enabled=True, **keys), fields))
    runs, names = [], []
    for seed in seeds:
        for side, (config, side_fields) in zip("ab", configs, strict=True):
            spec = dataclasses.replace(bases[seed], additional_config=config, **side_fields,
                                       out_dir=ab_dir / f"seed{seed}" / side)
            runs.append(check(spec))
            Path(spec.out_dir).mkdir(parents=True)
            names.append(f"ab/seed{seed}/{side}")
    note(args, f"tune: the A/B of trial {best['number']} against DyntraLB off on "
               f"{len(seeds)} fresh seed(s) ({', '.join(map(str, seeds))})")
    metrics = run_batch(args, executor, runs, names, "the A/B", f"{ab_dir}/seed<s>/a and b/")
    pairs = [(seed, metrics[2 * i], metrics[2 * i + 1]) for i, seed in enumerate(seeds)]
    labels = ("DyntraLB off", f"trial {best['number']}")
    write_ab_json(ab_dir / "ab.json", workload=args.workload, dp_size=bases[seeds[0]].dp_size,
                  labels=labels, pairs=pairs)
    return {"seeds": seeds, "labels": labels, "pairs": pairs}


def confidence(best: dict | None, ab: dict | None, fixed_trace: bool,
               windows: int | None = None) -> str:
    """The line on how sure the recommendation is; with ``tune --split``'s ``windows``,
    from the search's spread over them."""
    if best is None:
        return "How sure: no A/B was run: the recommendation is to keep DyntraLB off."
    search = best["estimates"].get("throughput")
    if windows is not None:
        return split_confidence(search, windows)
    if fixed_trace:
        gain = "" if search is None else f" ({search[0]:+.2f} % throughput)"
        return (f"How sure: exact for this trace{gain}: the emulator is deterministic and a "
                "trace file is one workload, so there is no seed-to-seed spread to measure; "
                "how it carries over to other traffic is not measured.")
    if ab is None:
        return "How sure: not measured (no fresh seeds: --ab-seeds 0)."
    _, deltas, ci = seed_summary(ab["pairs"])[0]
    if ci is None:
        return (f"How sure: one fresh seed, {deltas[0]:+.2f} % throughput; no interval "
                "(--ab-seeds 2 or more gives one).")
    mean, half = ci
    est = "" if search is None else (f" (the search estimated {search[0]:+.2f} ± "
                                     f"{search[1]:.2f} % on its own seeds)")
    if mean - half > 0:
        verdict = "sure it wins: the 95 % CI of its throughput gain lies above 0"
    elif mean + half < 0:
        verdict = "it loses: the 95 % CI of its throughput gain lies below 0"
    else:
        verdict = ("not sure: the 95 % CI of its throughput gain includes 0; more trials "
                   "or seeds may tell")
    return (f"How sure: {verdict}, {mean:+.2f} ± {half:.2f} % over {len(deltas)} fresh "
            f"seeds{est}.")
