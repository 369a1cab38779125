"""Lingvo's trainer flags: which ones the binary takes, and where the others' settings live here.

Plain functions over the command line; the flags themselves are defined only in trainer/main.py.
Taken: ``--run_locally=cpu`` (every job already runs in this one process by default; Lingvo's
``--run_locally=cpu --mode=sync`` is that one-process run, ``--mode=train`` here) and
``--job=trainer_client`` (Lingvo's name of the trainer job). A Lingvo flag with an equivalent is refused
with one line pointing to it (docs/lingvo.md has the whole table).
"""

from __future__ import annotations

from params.errors import ConfigError

# Lingvo flag -> (this project's equivalent, an example using the flag's value; {value} is replaced).
POINTERS = {
    "saver_max_to_keep": (
        "the param task.train.save_max_to_keep",
        "--params_override='task.train.save_max_to_keep : {value}'",
    ),
    "worker_split_size": (
        "the param cluster.num_logical_cpu_devices (K logical CPU devices for a K-stage pipeline)",
        "--params_override='cluster.num_logical_cpu_devices : {value}'",
    ),
    "ps_replicas": (
        "--cluster_spec, which lists every task (--mode=async)",
        "--cluster_spec=controller=h:p@trainer=h:p,h:p@ps=h:p",
    ),
    "worker_replicas": (
        "--cluster_spec, which lists every task (--mode=sync)",
        "--cluster_spec=trainer=h:p,h:p",
    ),
    "model_params_override": ("--params_override", "--params_override='{value}'"),
    "model_params_file_override": ("--params_file_override", "--params_file_override={value}"),
    "task": ("--task_index (this process's index within its --job)", "--task_index={value}"),
    "controller_job": ("--cluster_spec and --job", "--cluster_spec=controller=h:p@... --job=controller"),
    "worker_job": ("--cluster_spec and --job", "--cluster_spec=trainer=h:p,h:p --job=trainer"),
    "ps_job": ("--cluster_spec and --job", "--cluster_spec=...@ps=h:p --job=ps"),
    "worker_gpus": (
        "the GPUs TensorFlow sees (each job uses them all; CUDA_VISIBLE_DEVICES chooses which)",
        "CUDA_VISIBLE_DEVICES=0,1 .venv/bin/python -m trainer ...",
    ),
    "saver_keep_checkpoint_every_n_hours": (
        "the param task.train.save_max_to_keep (no checkpoint is kept by age; 0 keeps every one)",
        "--params_override='task.train.save_max_to_keep : 0'",
    ),
}

# Lingvo's --mode values -> (this project's equivalent, an example).
MODE_POINTERS = {
    "shell": ("Python itself (no shell mode)", "python -i -c 'from params import experiment'"),
    "inspect_evaler": ("--mode=inspect_datasets (each data set's input Params)", "--mode=inspect_datasets"),
    "inspect_decoder": ("--mode=inspect_datasets (each data set's input Params)", "--mode=inspect_datasets"),
    "inspect_model": (
        "--mode=inspect_params (the Params) or --mode=inspect_placement (layers and weights per device)",
        "--mode=inspect_placement",
    ),
    "write_inference_graph": ("python -m tools.export (a SavedModel)", "python -m tools.export --logdir=DIR"),
}

JOB_ALIASES = {"trainer_client": "trainer"}


def pointer(argv: list[str]) -> str | None:
    """The one-line error for the first Lingvo flag on the command line that has an equivalent here."""
    for index, arg in enumerate(argv[1:], start=1):
        if arg == "--":
            break
        if not arg.startswith("-"):
            continue
        name, has_value, value = arg.lstrip("-").partition("=")
        if name not in (*POINTERS, "mode", "job"):
            continue
        if not has_value and index + 1 < len(argv) and not argv[index + 1].startswith("-"):
            value = argv[index + 1]  # --flag value
        if name == "mode" and value in MODE_POINTERS:
            equivalent, example = MODE_POINTERS[value]
            return (
                f"--mode={value} is Lingvo's mode; here use {equivalent}, e.g. {example} (see docs/lingvo.md)"
            )
        once = [job for job in value.split(",") if job.strip().startswith("evaler_once_")]
        if name == "job" and once:
            dataset = once[0].strip()[len("evaler_once_") :].split("@")[0] or "dev"
            return (
                f"--job={once[0].strip()} is Lingvo's one-checkpoint evaler; here --job=evaler_{dataset} "
                "without a trainer scores each checkpoint of --logdir not yet scored, then stops "
                "(see docs/lingvo.md)"
            )
        if name not in POINTERS:
            continue
        equivalent, example = POINTERS[name]
        example = example.replace("{value}", value or "N")
        return f"--{name} is Lingvo's flag; here use {equivalent}, e.g. {example} (see docs/lingvo.md)"
    return None


def job_names(jobs: list[str]) -> list[str]:
    """``--job`` with Lingvo's job names mapped to this project's (trainer_client -> trainer)."""
    return [JOB_ALIASES.get(job.strip(), job) for job in jobs]


def local_mode(run_locally: str | None, mode: str, cluster_spec: str | None, gpus: int) -> str:
    """The --mode to run with ``--run_locally`` (Lingvo's one-process run): sync or async without a
    cluster become train, the one-process mode here. ``gpus``: how many GPUs TensorFlow sees."""
    if not run_locally:
        return mode
    if run_locally == "gpu" and gpus == 0:
        raise ConfigError(
            "--run_locally=gpu: TensorFlow sees no GPU here; the jobs use whatever devices it sees, so "
            "leave the flag out (or use --run_locally=cpu)"
        )
    if mode in ("sync", "async"):
        if cluster_spec:
            raise ConfigError(
                f"--run_locally={run_locally} runs one process, but --mode={mode} --cluster_spec=... is one "
                "task of a cluster: leave out one of them"
            )
        return "train"
    return mode
