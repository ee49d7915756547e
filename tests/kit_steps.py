"""Driving a kit scheduler in a unit test the way the kit's engine does: ``forward``
runs the worker (``emu.impl.kit.model_runner.ModelRunner``) on a ``schedule()``'s output
and hands its output to ``update_from_output``; with synchronous scheduling and MTP the
worker's drafts then go to ``update_draft_token_ids``. Each scheduler gets one worker,
kept here (a worker counts each request's tokens across steps); ``use_drafts`` gives it
an acceptance rule."""

from __future__ import annotations

import weakref

from emu.impl.kit.async_scheduler import AsyncScheduler
from emu.impl.kit.model_runner import ModelRunner, ModelRunnerOutput
from emu.rank.spec_decode import DraftAcceptance

_runners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runner_of(scheduler) -> ModelRunner:
    """The scheduler's worker (made on first use, without drafts)."""
    runner = _runners.get(scheduler)
    if runner is None:
        runner = use_drafts(scheduler, None)
    return runner


def use_drafts(scheduler, acceptance: DraftAcceptance | None) -> ModelRunner:
    """Give the scheduler a worker with ``acceptance`` (None: no drafts)."""
    runner = ModelRunner(acceptance, scheduler.connector,
                         placeholder_drafts=isinstance(scheduler, AsyncScheduler))
    _runners[scheduler] = runner
    return runner


def execute(scheduler, output, ended_s: float) -> ModelRunnerOutput:
    """The worker's forward of ``output``, ended at ``ended_s``."""
    return runner_of(scheduler).execute_model(output, scheduler.requests, ended_s)


def forward(scheduler, output, ended_s: float) -> list:
    """The forward of ``output`` ended at ``ended_s`` and its output processed at once
    (synchronous scheduling); returns the requests it finished."""
    finished = scheduler.update_from_output(output, execute(scheduler, output, ended_s))
    if output.total_num_scheduled_tokens > 0 and scheduler.num_spec_tokens:
        scheduler.update_draft_token_ids(runner_of(scheduler).take_draft_token_ids())
    return finished
