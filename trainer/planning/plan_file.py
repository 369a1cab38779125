"""A plan as a params file (``key : value`` lines) that ``python -m trainer --model=EXP
--params_file_override=PLAN`` applies unchanged, and the command line that runs it."""

from __future__ import annotations

import shlex

from params import text_format
from trainer.planning.candidates import Plan


def lines(plan: Plan, pipeline_prefix: str, batch_size: int, intra_op_threads: int = 0) -> dict[str, object]:
    """The keys a plan sets, with their values (``intra_op_threads`` > 0: each process's threads per op,
    the cores the planner gave it)."""
    p = f"task.{pipeline_prefix}"
    keys: dict[str, object] = {
        f"{p}.num_stages": plan.num_stages,
        f"{p}.num_micro_batches": plan.num_micro_batches,
        f"{p}.micro_batch_size": 0,
        f"{p}.schedule": plan.schedule,
        f"{p}.virtual_stages": plan.virtual_stages,
        f"{p}.remat": plan.remat,
        f"{p}.split_points": list(plan.split_points),
        f"{p}.schedule_file": "",
    }
    if plan.placement == "pipeline_mesh":  # a 'model' axis; the experiment's stage_layout_rules shard it
        keys[f"{p}.stage_mesh_shape"] = [plan.stage_mesh]
        keys[f"{p}.stage_mesh_axis_names"] = ["model"]
    else:  # plain devices, whatever stage mesh the experiment configures
        keys[f"{p}.stage_mesh_shape"] = []
        keys[f"{p}.stage_mesh_axis_names"] = []
        keys[f"{p}.stage_layout_rules"] = ""
    devices = plan.num_stages * plan.stage_mesh if plan.placement != "stage_processes" else plan.num_stages
    keys["cluster.num_logical_cpu_devices"] = devices if devices > 1 else 0
    if intra_op_threads > 0:
        keys["cluster.intra_op_threads"] = intra_op_threads
    return keys


def text(plan: Plan, pipeline_prefix: str, batch_size: int, intra_op_threads: int = 0) -> str:
    """The params file's text."""
    body = [
        f"{key} : {text_format.format_value(value)}"
        for key, value in lines(plan, pipeline_prefix, batch_size, intra_op_threads).items()
    ]
    return "\n".join(body) + "\n"


def command(plan: Plan, model: str, path: str, logdir: str) -> str:
    """The command that trains ``plan`` (stage processes and replicas through tools.local_cluster)."""
    flags = f"--model={model} --logdir={shlex.quote(logdir)}"
    override = f"-- --params_file_override={shlex.quote(path)}"
    if plan.placement == "stage_processes":
        return f".venv/bin/python -m tools.local_cluster --stages={plan.num_stages} {flags} {override}"
    if plan.replicas > 1:
        return f".venv/bin/python -m tools.local_cluster --workers={plan.replicas} {flags} {override}"
    return f".venv/bin/python -m trainer {flags} --params_file_override={shlex.quote(path)}"
