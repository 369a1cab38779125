"""Lingvo's flags: pointers to their equivalents, and Lingvo's command line on a Lingvo-style experiment.

The flag pointers run through the binary's own flag parser in this process (they stop it before absl
parses anything); the runs go through the real binary on tests/trainer/lingvo_experiment.py."""

from __future__ import annotations

import pytest

from params.errors import ConfigError
from tests.trainer import runner
from trainer import lingvo_flags


@pytest.mark.parametrize(
    "flag, pointer",
    [
        (
            "--saver_max_to_keep=3",
            "task.train.save_max_to_keep, e.g. --params_override='task.train.save_max_to_keep : 3'",
        ),
        ("--worker_split_size=2", "cluster.num_logical_cpu_devices"),
        ("--ps_replicas=2", "--cluster_spec"),
        ("--worker_replicas=4", "--cluster_spec"),
        ("--model_params_override=task.train.max_steps : 5", "here use --params_override"),
        ("--worker_gpus=2", "CUDA_VISIBLE_DEVICES"),
        ("--saver_keep_checkpoint_every_n_hours=1", "task.train.save_max_to_keep : 0"),
        ("--mode=shell", "Python itself"),
        ("--mode=inspect_evaler", "--mode=inspect_datasets"),
        ("--mode=inspect_decoder", "--mode=inspect_datasets"),
        ("--mode=inspect_model", "--mode=inspect_placement"),
        ("--mode=write_inference_graph", "tools.export"),
        ("--job=evaler_once_dev@1500", "--job=evaler_dev without a trainer"),
    ],
)
def test_a_lingvo_flag_with_an_equivalent_points_to_it(flag, pointer):
    """The line trainer/main.py's flag parser prints (``trainer: error: `` and this) and exits 2 with;
    in-process through lingvo_flags, since trainer.main's absl flags cannot be defined beside another
    binary's in one test process (test_cli.py runs the binary)."""
    line = lingvo_flags.pointer(["trainer", "--model=image.digits.ConvNet", flag])
    name = flag.split("=")[0] if flag.startswith("--") and "_" in flag.split("=")[0][2:] else flag
    assert line is not None and "\n" not in line
    assert line.startswith(f"{name} is Lingvo's ") and "; here " in line
    assert pointer in line


def test_a_flag_given_as_two_arguments_keeps_its_value():
    line = lingvo_flags.pointer(["trainer", "--worker_split_size", "4", "--model=x"])
    assert "cluster.num_logical_cpu_devices : 4" in line
    assert lingvo_flags.pointer(["trainer", "--model=x", "--", "--saver_max_to_keep=3"]) is None


def test_run_locally_is_the_one_process_mode():
    assert lingvo_flags.local_mode("cpu", "sync", None, gpus=0) == "train"
    assert lingvo_flags.local_mode("cpu", "inspect_params", None, gpus=0) == "inspect_params"
    assert lingvo_flags.local_mode(None, "sync", "trainer=h:1", gpus=0) == "sync"
    with pytest.raises(ConfigError, match="leave out one of them"):
        lingvo_flags.local_mode("cpu", "sync", "trainer=h:1,h:2", gpus=0)
    with pytest.raises(ConfigError, match="sees no GPU"):
        lingvo_flags.local_mode("gpu", "train", None, gpus=0)
    assert lingvo_flags.job_names(["controller", "trainer_client", "evaler_dev"]) == [
        "controller",
        "trainer",
        "evaler_dev",
    ]


# ---------------------------------------------------------------------------------- the binary


@pytest.fixture(scope="module")
def lingvo_run(tmp_path_factory, data_dir):
    """Lingvo's README command line on a Lingvo-style experiment: it trains in this one process."""
    logdir = tmp_path_factory.mktemp("lingvo") / "run"
    flags = (
        "--run_locally=cpu",
        "--mode=sync",
        "--logtostderr",
        "--job=controller,trainer_client,evaler_dev",
    )
    return logdir, runner.run_command(runner.lingvo_command(logdir, data_dir, *flags))


@pytest.mark.slow
def test_a_lingvo_experiment_trains_with_lingvos_flags(lingvo_run):
    logdir, result = lingvo_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "jobs controller, trainer, evaler_dev" in result.stdout
    assert "trainer: done at step 20" in result.stdout
    assert "eval_dev: step 20:" in result.stdout
    params = (logdir / "params.txt").read_text()
    assert "input.train.batch_size : 16" in params and "Train" not in params


@pytest.mark.slow
def test_an_evaler_on_a_finished_run_says_there_is_nothing_left_to_score(lingvo_run, data_dir):
    logdir, _ = lingvo_run
    result = runner.run_command(runner.lingvo_command(logdir, data_dir, "--job=evaler_dev"))
    assert result.returncode == 0, result.stderr
    assert "holds a finished run (checkpoint at step 20" in result.stdout  # said before any job starts
    assert "every job done): nothing to do, nothing written" in result.stdout


@pytest.mark.parametrize(
    "name, equivalent",
    [
        ("cell_tpl", "'stages'"),
        ("splits", "'split_points'"),
        ("before_tpl", "outside"),
        ("state_dtype", "dtype"),
    ],
)
def test_a_lingvo_gpipe_param_names_its_equivalent(name, equivalent):
    from params import experiment

    root = experiment.resolve("image.digits.GPipeConvNet")
    with pytest.raises(ConfigError, match=rf"'{name}' is Lingvo's name; here .*{equivalent}"):
        root.set(**{f"task.body.sub[0].{name}": 1})
