"""The TensorPipe binary: flags -> resolved Params -> jobs.

    python -m trainer --model=image.digits.ConvNet --logdir=runs/digits
    python -m trainer --model=image.digits.ConvNet --mode=inspect_params \\
        --params_override="task.train.learning_rate : 0.5"
    bazel run //trainer -- --model=image.digits.ConvNet --mode=inspect_params

Flags are read here and nowhere else. Every setting a job uses comes from the resolved Params, which
are printed by --mode=inspect_params and written to <logdir>/params.txt.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from absl import app, flags  # noqa: E402

from params import experiment, registry  # noqa: E402
from params.errors import ConfigError, UserError  # noqa: E402
from params.hyperparams import InstantiableParams, Params  # noqa: E402
from trainer import lingvo_flags, signals, tf_startup  # noqa: E402


def _inspect_params(root: Params) -> int:
    sys.stdout.write(root.to_text())
    return 0


def _inspect_datasets(root: Params) -> int:
    sys.stdout.write(inspect_datasets(root))
    return 0


def _serve_stages(root: Params) -> int:
    from trainer.distributed import remote_stages

    return remote_stages.serve(root, FLAGS.cluster_spec, FLAGS.task_index)


def _inspect_placement(root: Params) -> int:
    from trainer.pipeline_views import placement_grid

    return placement_grid.run(root, FLAGS.logdir, log=print)


def _profile_pipeline(root: Params) -> int:
    from trainer.pipeline_views import profiling

    return profiling.run(root, FLAGS.logdir, log=print)


def _mesh(root: Params) -> int:
    from trainer.distributed import mesh_cluster

    return mesh_cluster.run(
        root,
        FLAGS.logdir,
        FLAGS.cluster_spec,
        FLAGS.task_index,
        allow_params_change=FLAGS.allow_params_change,
        cluster_wait_secs=FLAGS.cluster_wait_secs,
    )


def _cluster_task(root: Params) -> int:
    from trainer.distributed import jobs as cluster_jobs

    return cluster_jobs.run(
        root,
        FLAGS.logdir,
        FLAGS.mode,
        FLAGS.job,
        FLAGS.cluster_spec,
        FLAGS.task_index,
        allow_params_change=FLAGS.allow_params_change,
        cluster_wait_secs=FLAGS.cluster_wait_secs,
    )


def _train(root: Params) -> int:
    from trainer import launcher, preflight

    done = preflight.finished(root, FLAGS.logdir, launcher.check_jobs(root, FLAGS.job))
    if done:
        print(done)
        return 0
    return launcher.run_jobs(
        root,
        FLAGS.logdir,
        FLAGS.job,
        allow_params_change=FLAGS.allow_params_change,
        cluster_spec=FLAGS.cluster_spec,
        cluster_wait_secs=FLAGS.cluster_wait_secs,
        model_task_name=FLAGS.model_task_name,
    )


@dataclasses.dataclass(frozen=True)
class Mode:
    """One value of --mode: what it does (its --help text) and how the binary runs it."""

    help: str
    run: Callable[[Params], int]
    builds: bool = True  # the preflight builds the task (cluster modes build it in their strategy or mesh)
    reports: bool = False  # the preflight prints the task's layers (no later build of this mode does)
    needs_logdir: bool = True
    saves: bool = True  # an interrupted run's line names the logdir's last checkpoint


MODES: dict[str, Mode] = {
    "train": Mode("run the jobs named by --job (one trainer process).", _train),
    "sync": Mode(
        "this process is one task of a training cluster (--cluster_spec or TF_CONFIG) that trains "
        "data parallel (all-reduce).",
        _cluster_task,
        builds=False,
    ),
    "async": Mode(
        "this process is one task of a training cluster (--cluster_spec or TF_CONFIG) that trains "
        "asynchronously with parameter servers.",
        _cluster_task,
        builds=False,
    ),
    "mesh": Mode(
        "this process is one of the processes a DTensor mesh (cluster.mesh_shape) is spread over "
        "(--cluster_spec=trainer=host:port,host:port).",
        _mesh,
        builds=False,
    ),
    "stages": Mode(
        "serve the GPipe stages (local-parallel blocks) of a trainer whose cluster.stage_job names this "
        "process's job, as task --task_index of --cluster_spec, until stopped (docs/parallelism/remote.md).",
        _serve_stages,
        builds=False,
        needs_logdir=False,
        saves=False,
    ),
    "inspect_params": Mode(
        "print the resolved Params and exit.", _inspect_params, reports=True, needs_logdir=False, saves=False
    ),
    "inspect_datasets": Mode(
        "print each data set's input Params.",
        _inspect_datasets,
        reports=True,
        needs_logdir=False,
        saves=False,
    ),
    "inspect_placement": Mode(
        "build the model as training would place it (GPipe stages, a mesh, stage meshes), train nothing, "
        "print its device grid (each device's layers and weight bytes) and write it to "
        "<logdir>/placement.svg.",
        _inspect_placement,
        saves=False,
    ),
    "profile_pipeline": Mode(
        "profile one forward and backward pass of a pipelined model and write "
        "<logdir>/pipeline_step.png (measured) next to pipeline_step_simulated.png, and image summaries.",
        _profile_pipeline,
    ),
}


FLAGS = flags.FLAGS
flags.DEFINE_string(
    "model",
    None,
    "Registry key of the experiment, e.g. image.digits.ConvNet (python -m tools.list_models), or the full "
    "import path of an experiment class in a package named by --experiment_packages. Nothing else is "
    "imported.",
)
flags.DEFINE_list(
    "experiment_packages",
    [],
    "Packages, besides tasks, whose modules --model may import by full path, e.g. my_pkg for "
    "--model=my_pkg.my_exps.MyExp (also TENSORPIPE_EXPERIMENT_PACKAGES=my_pkg,other; docs/experiments.md).",
)
flags.DEFINE_string(
    "logdir",
    None,
    "Directory (local path or tf.io.gfile URI) shared by all jobs "
    "of a run: checkpoints, params.txt, TensorBoard summaries. Needed by --mode=train.",
)
flags.DEFINE_enum(
    "mode",
    "train",
    list(MODES),
    " ".join(f"{name}: {mode.help}" for name, mode in MODES.items()),
)
flags.DEFINE_string(
    "cluster_spec",
    None,
    "--mode=sync|async: the training cluster in Lingvo's syntax, jobs separated by '@', tasks by ',': "
    "sync: trainer=host:port,host:port; async: controller=host:port@trainer=host:port,...@ps=host:port. "
    "Empty: read TF_CONFIG. With cluster.stage_job (--mode=train and --mode=stages): the stage tasks, "
    "e.g. worker=host:port,host:port[@controller=host:port: the trainer's address, across machines].",
)
flags.DEFINE_integer("task_index", 0, "--mode=sync|async|mesh|stages: this process's index within its --job.")
flags.DEFINE_integer(
    "cluster_wait_secs",
    600,
    "--mode=sync|async|mesh, and a trainer whose cluster.stage_job names stage processes: seconds to "
    "wait for the other tasks of the cluster (stage processes too) to start (saying which every 10 s) "
    "before giving up with one line naming them.",
    lower_bound=1,
)
flags.DEFINE_list(
    "job",
    [],
    "Jobs to run in this process, comma separated: controller, trainer (Lingvo's trainer_client too), "
    "evaler_<dataset>, decoder_<dataset>. Empty (the default): all of them, in one "
    "process.",
)
flags.DEFINE_enum(
    "run_locally",
    None,
    ["cpu", "gpu"],
    "Lingvo's flag, taken for its habit: every job already runs in this one process by default, on the "
    "devices TensorFlow sees; with --mode=sync or async (and no --cluster_spec) it means --mode=train.",
)
flags.DEFINE_string(
    "params_override",
    None,
    "Params text applied last, 'key : value' statements "
    "separated by ';' or newlines, e.g. 'task.train.learning_rate : 0.1'.",
)
flags.DEFINE_string(
    "params_file_override", None, "A file of 'key : value' lines, applied before --params_override."
)
flags.DEFINE_multi_string(
    "gin_file",
    [],
    "Gin files binding experiment constructor knobs "
    "(e.g. ConvNet.num_layers = 4). Applied before any params override.",
)
flags.DEFINE_multi_string(
    "gin_param", [], "Gin bindings, e.g. 'ConvNet.num_layers = 4'; applied after --gin_file."
)
flags.DEFINE_bool(
    "allow_params_change",
    False,
    "Go on in a logdir whose params.txt names another experiment, other model shapes than its "
    "checkpoint, or a finished run with changed settings (the logdir guard stops these by default).",
)
flags.DEFINE_bool(
    "gin_allow_code",
    False,
    "Trust --gin_file/--gin_param as code: allow gin's import, include, @references, macros and "
    "scopes, which import and call arbitrary Python. Off: gin only sets experiment knobs to literals.",
)
flags.DEFINE_string(
    "model_task_name",
    "",
    "Lingvo's flag, for a multi-task experiment: this process's evalers and decoders run for this task "
    "alone, and its trainer trains it alone ('': every task; trainer/multi_task_jobs.py).",
)


HELP_FLAGS = ("-?", "-h", "--help", "--helpshort", "--helpfull", "--helpxml")


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parser, but a bad flag is one line and exit status 2, and --help exits 0; a Lingvo flag
    with an equivalent here names it."""
    lingvo_pointer = lingvo_flags.pointer(argv)
    if lingvo_pointer:
        print(f"trainer: error: {lingvo_pointer}", file=sys.stderr)
        sys.exit(2)
    try:
        return FLAGS(argv)
    except flags.Error as e:
        print(f"trainer: error: {e} (see --help)", file=sys.stderr)
        sys.exit(2)
    except SystemExit:
        if any(arg.split("=")[0] in HELP_FLAGS for arg in argv[1:]):
            sys.exit(0)  # absl exits 1 after printing help; asking for help is not a failure
        raise


def resolve_params() -> Params:
    """The frozen Params this invocation runs, from --model and every override flag."""
    if not FLAGS.model:
        raise ConfigError("--model is required (.venv/bin/python -m tools.list_models lists the experiments)")
    registry.add_experiment_packages(FLAGS.experiment_packages)
    return experiment.resolve(
        FLAGS.model,
        gin_files=FLAGS.gin_file,
        gin_bindings=FLAGS.gin_param,
        params_file_override=FLAGS.params_file_override,
        params_override=FLAGS.params_override,
        gin_allow_code=FLAGS.gin_allow_code,
    )


def inspect_datasets(root: Params) -> str:
    """Each data set, the jobs that read it, its input Params and what its input shows of its data."""
    from tasks.lm import vocabulary

    blocks = []
    for name in root.input.names():
        jobs = "trainer" if name == "train" else f"evaler_{name}, decoder_{name}"
        p = root.input.get(name)
        body = "".join(f"  {line}\n" for line in vocabulary.unused_level_marked(p.to_text()).splitlines())
        # What the input shows of its data (decoded examples, lengths), when it is an input generator.
        data = p.instantiate().inspect() if isinstance(p, InstantiableParams) else ""
        blocks.append(f"{name} (jobs: {jobs})\n{body}{data}")
    return "\n".join(blocks)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r} (flags need --name=value)")
    if FLAGS["job"].present and (not FLAGS.job or not all(j.strip() for j in FLAGS.job)):
        raise ConfigError(
            f"--job: empty job name in {','.join(FLAGS.job)!r} (leave --job out to run all jobs)"
        )
    FLAGS.job = lingvo_flags.job_names(FLAGS.job)
    if FLAGS.run_locally:
        import tensorflow as tf

        gpus = len(tf.config.list_physical_devices("GPU"))
        FLAGS.mode = lingvo_flags.local_mode(FLAGS.run_locally, FLAGS.mode, FLAGS.cluster_spec, gpus)
    root = resolve_params()
    if FLAGS.model_task_name and FLAGS.mode != "train":
        raise ConfigError(
            f"--model_task_name picks one task's jobs with --mode=train, not --mode={FLAGS.mode}"
        )
    from trainer import preflight  # imports TensorFlow: after tf_startup, as every job module

    mode = MODES[FLAGS.mode]
    # what training would refuse (cluster modes build the task inside their strategy or mesh); the
    # modes that build the task again report its layers then
    preflight.check(root, build=mode.builds, report=mode.reports)
    if mode.needs_logdir and not FLAGS.logdir:
        typo = FLAGS["log_dir"].present  # absl's own flag (its log files), silently taken otherwise
        hint = "; --log_dir is absl's directory for its log files: did you mean --logdir?" if typo else ""
        raise ConfigError(
            f"--logdir is required by --mode={FLAGS.mode} (a local path or a tf.io.gfile URI){hint}"
        )
    return mode.run(root)


def _checkpoint_note() -> str:
    """How an interrupted run's line ends: its last checkpoint is intact, or none was saved yet."""
    if not FLAGS.logdir or not MODES[FLAGS.mode].saves:
        return "; nothing was written"
    from trainer import checkpointer, files

    try:
        saved = checkpointer.list_checkpoints(files.join(FLAGS.logdir, "train"))
    except Exception:  # noqa: BLE001 (only for the last message; never hide the interruption)
        return signals.TRAINER_NOTE
    if not saved:
        return "; no checkpoint was saved yet"
    return f"; the last saved checkpoint ({saved[-1][1]}) is intact"


def run() -> None:
    """Entry point: one clear line and a non-zero exit for anything the user can fix."""
    if "BUILD_WORKING_DIRECTORY" in os.environ:  # bazel run: relative paths mean the user's cwd
        os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])
    sys.stderr.reconfigure(errors="backslashreplace")  # an undecodable argument echoed in an error
    sys.stdout.reconfigure(errors="backslashreplace")
    signals.install_for_binary("trainer", note=signals.TRAINER_NOTE)  # done by trainer/__init__.py under -m
    tf_startup.use_system_allocator()  # freed tensors go back to the OS (docs/parallelism/remote.md)

    def _main(argv: list[str]) -> None:
        # TensorFlow after the flags: a mistyped flag or --help answers without its seconds of import.
        tf_startup.import_tensorflow()
        # From here on a signal's line says whether a checkpoint was saved yet (the note reads the
        # logdir through the checkpointer, which must not be imported inside TensorFlow's import).
        signals.install_for_binary("trainer", note=_checkpoint_note)
        try:
            sys.exit(main(argv))
        except UserError as e:
            print(f"trainer: error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            print(f"trainer: interrupted{_checkpoint_note()}", file=sys.stderr)
            sys.exit(signals.INTERRUPT_EXIT_CODE)
        except signals.Terminated as e:
            print(f"trainer: {str(e).replace(signals.TRAINER_NOTE, _checkpoint_note())}", file=sys.stderr)
            sys.exit(signals.EXIT_CODE)
        except Exception:
            signum = signals.arrived()  # an interruption that TensorFlow turned into another error
            if signum is None:
                raise
            print(f"trainer: {signals.WORDS[signum]}{_checkpoint_note()}", file=sys.stderr)
            sys.exit(signals.exit_code(signum))

    app.run(_main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
