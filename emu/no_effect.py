"""Why DyntraLB did nothing: the reason, with the numbers, when a run with DyntraLB
enabled generated no plan or only empty ones.

``run`` and ``ab`` call ``no_effect_notes(metrics)`` on each run's metrics (the config
recorded by the CLI plus the ``lb_activity`` facts from emu/metrics.py) and show the
notes in the summary. ``validate`` calls ``trace_warnings`` before anything runs, on
what the trace alone can tell. A run that did something gets no note.
"""

from __future__ import annotations

from dyntra_lb.blocks import num_blocks
from dyntra_lb.config import DyntraLBConfig, load_additional_config


def _lb_config(metrics: dict) -> DyntraLBConfig | None:
    """DyntraLB's config of the run, when it was enabled and recorded."""
    config = metrics.get("config") or {}
    if "additional_config" not in config:
        return None
    try:
        lb = load_additional_config(config["additional_config"]).dyntra_lb
    except ValueError:
        return None
    return lb if lb.enabled else None


def never_arms(lb: DyntraLBConfig, largest_prompt_tokens: int, block_size: int) -> str | None:
    """The reason dynamic mode can never activate on these prompts, or None. A request
    arms it when its prompt has more than ``long_req_block_threshold`` blocks
    (docs/protocol.md, "Dynamic mode")."""
    if lb.mode != "dynamic":
        return None
    largest = num_blocks(largest_prompt_tokens, block_size)
    if largest > lb.long_req_block_threshold:
        return None
    return (f"dynamic mode never activated: the largest prompt is {largest:,} blocks "
            f"({largest_prompt_tokens:,} tokens at block size {block_size}), and only a "
            f"request with more than long_req_block_threshold = "
            f"{lb.long_req_block_threshold:,} blocks activates it. Hint: lower "
            f"long_req_block_threshold below {largest:,}, use \"mode\": \"static\", or "
            "check --block-size")


def _window_reason(lb: DyntraLBConfig, longest_wave: int, armed: bool) -> str | None:
    """The reason the start_step/end_step window never opened, or None. ``armed``:
    the trace has a request that activates dynamic mode (always true in static mode)."""
    if lb.start_step > longest_wave:
        return (f"start_step = {lb.start_step:,} is beyond the last step of every wave "
                f"(the longest wave reached step {longest_wave:,}). Hint: lower start_step "
                f"below {longest_wave:,}, or give the trace longer waves")
    if lb.end_step >= 0 and armed:
        when = (" and dynamic mode only plans after a long request arrived"
                if lb.mode == "dynamic" else "")
        return (f"the window closed: the planner may run only from step {lb.start_step:,} "
                f"to before end_step = {lb.end_step:,} of a wave{when}. Hint: end_step -1 "
                "plans to the end of every wave")
    return None


def no_effect_notes(metrics: dict) -> list[str]:
    """One note per reason DyntraLB, enabled in this run, did nothing; [] when it was
    off or did something."""
    lb = _lb_config(metrics)
    activity = metrics.get("lb_activity")
    if lb is None or activity is None:
        return []
    churn = metrics["plan_churn"]
    block_size = (metrics.get("config") or {}).get("block_size")
    if activity["planner_steps"] == 0:
        arms = None
        if block_size is not None and activity["largest_prompt_tokens"] is not None:
            arms = never_arms(lb, activity["largest_prompt_tokens"], block_size)
        reasons = [r for r in (arms, _window_reason(lb, activity["longest_wave_steps"],
                                                    arms is None)) if r is not None]
        if not reasons:
            reasons = [f"the planner never ran ({lb.mode} mode, start_step {lb.start_step:,}, "
                       f"end_step {lb.end_step:,}) and the run's numbers do not say why"]
        return [f"DyntraLB generated no plan: {r}" for r in reasons]
    if churn["outs"] + churn["ins"] == 0 and churn["paused"] == 0:
        threshold = lb.bubble_threshold
        unit = "blocks of imbalance" if threshold >= 1 else "normalized imbalance"
        balance = metrics.get("balance_ratio")
        shown = "-" if balance is None else f"{balance:.3f}"
        return [f"DyntraLB planned on {activity['planner_steps']:,} steps, but every plan "
                f"was empty: no request was paused and no admission was restricted. Hint: "
                f"the ranks' loads may never have exceeded bubble_threshold = {threshold:g} "
                f"({unit}); the run's balance ratio was {shown}"]
    return []


def trace_warnings(lb: DyntraLBConfig, trace, block_size: int) -> list[str]:
    """What the trace alone says DyntraLB will not do (for ``validate``)."""
    if not lb.enabled or not trace:
        return []
    reason = never_arms(lb, max(r.prompt_tokens for r in trace), block_size)
    return [] if reason is None else [f"DyntraLB will generate no plan: {reason}"]
