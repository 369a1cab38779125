"""``python -m tools.kill_drill``: SIGKILL the trainer at random moments, restart it each time, and
check that the end is the same as a run never interrupted.

    .venv/bin/python -m tools.kill_drill --kills=20
    .venv/bin/python -m tools.kill_drill --kills=3 --model=my.Exp --params_override='...'
    .venv/bin/python -m tools.kill_drill --kills=3 --model=lm.text.TextTransformerLM --corpus_lines=695

``--params_override`` goes after the drill's own cadence (max_steps 600, a save, log and summary every
20 steps), so it changes only what it names. ``--corpus_lines=N`` trains on the first N lines of the
experiment's ``input.train.file_pattern`` (copied into the work directory): a small corpus, whose
runs go through many epochs, each restart resuming in the middle of one.

First an uninterrupted reference run; then the drill run in its own logdir, started with the same flags
and killed ``--kills`` times, each kill at a moment of one kind, in turn: ``save`` (the instant a
checkpoint is being written: a ``ckpt-*_temp`` directory or a state file being replaced),
``random`` (any time), ``eval`` (just after a save, while the in-process evalers and decoders run),
``startup`` (during start-up or the catch-up of a restart). Then it runs to the end and checks: the
final checkpoint equals the reference's tensor for tensor (max abs diff 0.0), every ``scores.jsonl``
has each step once with the reference's metrics, and no ``_temp`` directory is left. Prints one JSON
line; exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OVERRIDE = (
    "task.train.max_steps : 600; task.train.save_interval_steps : 20; task.train.log_interval_steps : 20; "
    "task.train.summary_interval_steps : 20"
)
KINDS = ("save", "random", "eval", "startup")


def _command(args: argparse.Namespace, logdir: Path) -> list[str]:
    command = [sys.executable, "-m", "trainer", f"--model={args.model}", f"--logdir={logdir}"]
    return command + [f"--params_override={_override(args)}"] + [f"--gin_param={g}" for g in args.gin_param]


def small_corpus(args: argparse.Namespace, work: Path) -> None:
    """``--corpus_lines``: the first N lines of the experiment's train files into ``work``, and the
    drill's runs pointed at them (``args.params_override``)."""
    import tensorflow as tf

    from params import experiment

    train = experiment.resolve(args.model, gin_bindings=args.gin_param, params_override=_override(args)).input
    train = train.train if "train" in train.names() else None
    if train is None or "file_pattern" not in train:
        raise SystemExit(f"kill_drill: --corpus_lines: {args.model}'s input.train has no file_pattern")
    lines: list[str] = []
    for pattern in train.file_pattern.split(","):
        for path in sorted(tf.io.gfile.glob(pattern.strip())):
            with tf.io.gfile.GFile(path) as f:
                lines += [line.rstrip("\n") for line in f if line.strip()]
    if len(lines) < args.corpus_lines:
        raise SystemExit(f"kill_drill: --corpus_lines={args.corpus_lines}: the train files have {len(lines)}")
    corpus = work / f"corpus-{args.corpus_lines}.txt"
    corpus.write_text("".join(line + "\n" for line in lines[: args.corpus_lines]))
    text = f"input.train.file_pattern : '{corpus}'"
    args.params_override = f"{args.params_override}; {text}" if args.params_override else text


def _override(args: argparse.Namespace) -> str:
    return "; ".join(text for text in (DEFAULT_OVERRIDE, args.params_override) if text)


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _saving(train_dir: Path) -> bool:
    """A save is in progress: TensorFlow's shard directory or a state file being replaced."""
    try:
        names = os.listdir(train_dir)
    except OSError:
        return False
    return any(n.endswith("_temp") or n.startswith("checkpoint.tmp") for n in names)


def _wait(proc: subprocess.Popen, until, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline and not until():
        time.sleep(0.002)


def _kill_once(args, rng, kind: str, logdir: Path, log: Path, ref_seconds: float) -> dict:
    """Starts the trainer, kills it at a moment of ``kind``; returns what happened."""
    train_dir = logdir / "train"
    offset = log.stat().st_size if log.exists() else 0
    with open(log, "a") as out:
        start = time.monotonic()
        proc = subprocess.Popen(
            _command(args, logdir), cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT
        )

        def new_output() -> str:
            with open(log) as f:
                f.seek(offset)
                return f.read()

        if kind == "save":
            _wait(proc, lambda: _saving(train_dir), timeout=ref_seconds + 60)
        elif kind == "eval":
            saves = new_output().count("trainer: saved")
            _wait(proc, lambda: new_output().count("trainer: saved") > saves, timeout=ref_seconds + 60)
            _wait(proc, lambda: False, timeout=rng.uniform(0.0, 0.3))
        elif kind == "startup":
            _wait(proc, lambda: False, timeout=rng.uniform(0.5, 6.0))
        else:
            _wait(proc, lambda: False, timeout=rng.uniform(1.0, max(2.0, ref_seconds / 3)))
        during_save = _saving(train_dir)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        code = proc.wait()
    return {
        "kind": kind,
        "code": code,
        "seconds": round(time.monotonic() - start, 2),
        "during_save": during_save,
    }


def _final_tensors(logdir: Path) -> dict:
    import numpy as np
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(str(logdir / "train"))
    reader = tf.train.load_checkpoint(state.model_checkpoint_path)
    out = {}
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if (dtype.is_floating or dtype.is_integer) and not name.startswith("save_counter"):
            out[name] = np.asarray(reader.get_tensor(name))
    return out


def _scores(logdir: Path) -> dict[str, list[dict]]:
    out = {}
    for path in sorted(logdir.glob("*/scores.jsonl")):
        out[path.parent.name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def run_drill(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kill_drill-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.corpus_lines:
        small_corpus(args, work)
    reference, drill, log = work / "reference", work / "drill", work / "drill.log"
    for path in (reference, drill, log):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    started = time.monotonic()
    ref = subprocess.run(_command(args, reference), cwd=REPO, env=_env(), capture_output=True, text=True)
    ref_seconds = time.monotonic() - started
    if ref.returncode != 0:
        raise SystemExit(f"kill_drill: the reference run failed ({ref.returncode}): {ref.stderr[-2000:]}")

    kills, finished_early = [], False
    while len(kills) < args.kills:
        result = _kill_once(args, rng, KINDS[len(kills) % len(KINDS)], drill, log, ref_seconds)
        if result["code"] != -signal.SIGKILL:
            finished_early = True  # exited by itself: finished (0) or failed
            kills.append(result)
            break
        kills.append(result)
    final = subprocess.run(_command(args, drill), cwd=REPO, env=_env(), capture_output=True, text=True)
    with open(log, "a") as out:
        out.write(final.stdout + final.stderr)

    expected, actual = _final_tensors(reference), _final_tensors(drill)
    max_diff = max(
        (float(abs(actual[n].astype("float64") - v.astype("float64")).max()) if n in actual else float("inf"))
        for n, v in expected.items()
    )
    ref_scores, drill_scores = _scores(reference), _scores(drill)
    duplicates = {job: len(r) - len({x["step"] for x in r}) for job, r in drill_scores.items()}
    scores_equal = {
        job: sorted(json.dumps(x, sort_keys=True) for x in drill_scores.get(job, []))
        == sorted(json.dumps(x, sort_keys=True) for x in records)
        for job, records in ref_scores.items()
    }
    temps = sorted(str(p.relative_to(drill)) for p in drill.glob("train/*_temp"))
    sigkills = [k for k in kills if k["code"] == -signal.SIGKILL]
    ok = (
        not finished_early
        and final.returncode == 0
        and max_diff == 0.0
        and set(expected) == set(actual)
        and not any(duplicates.values())
        and all(scores_equal.values())
        and not temps
    )
    return {
        "ok": ok,
        "model": args.model,
        "corpus_lines": args.corpus_lines,
        "sigkills": len(sigkills),
        "kills_by_kind": {k: sum(1 for x in sigkills if x["kind"] == k) for k in KINDS},
        "kills_during_save": sum(1 for x in sigkills if x["during_save"]),
        "exited_before_kill": [k for k in kills if k["code"] != -signal.SIGKILL],
        "final_exit": final.returncode,
        "max_abs_diff": max_diff,
        "tensors": len(expected),
        "scores_jobs": sorted(ref_scores),
        "scores_steps": {job: len(r) for job, r in drill_scores.items()},
        "scores_duplicates": duplicates,
        "scores_equal_reference": scores_equal,
        "temp_dirs_left": temps,
        "reference_seconds": round(ref_seconds, 1),
        "total_seconds": round(time.monotonic() - started, 1),
        "loadavg_1m": os.getloadavg()[0],
        "workdir": str(work),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kill_drill", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs before the final run (default 20).")
    parser.add_argument("--model", default="image.digits.ConvNet")
    parser.add_argument(
        "--params_override", default="", help="Params text, after the drill's cadence (module doc)."
    )
    parser.add_argument(
        "--corpus_lines",
        type=int,
        default=0,
        help="Train on the first N lines of the experiment's train files (module doc; 0: all).",
    )
    parser.add_argument("--gin_param", action="append", default=[])
    parser.add_argument("--seed", type=int, default=0, help="Seeds the choice of kill moments.")
    parser.add_argument("--workdir", default=None, help="Where the two logdirs go (default: a new temp dir).")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be >= 1")
    if args.corpus_lines < 0:
        parser.error("--corpus_lines must be >= 0")
    summary = run_drill(args)
    print(json.dumps(summary, sort_keys=True))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
