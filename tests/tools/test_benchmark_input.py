"""``python -m tools.benchmark input``: the training input's cost a step, whole and per worker."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.benchmarks import input as input_benchmark

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "input", *flags],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    "flags, message",
    [(["--workers=1"], "--workers >= 2"), (["--batch_size=63"], "a multiple of --workers")],
)
def test_bad_flags_are_a_usage_error(flags, message, capsys):
    # In this process (each check returns before the benchmark pins a core or reads any input).
    assert input_benchmark.main(["input", *flags]) == 2
    assert message in capsys.readouterr().err


def test_prints_each_side_and_the_ratios():
    proc = _run("--steps=5", "--rounds=2", "--batch_size=64")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    sides = {line["side"]: line["ms_per_step"] for line in lines if "side" in line}
    assert set(sides) == {"one", "worker_elements", "worker"} and all(v > 0 for v in sides.values())
    ratios = lines[-1]
    want = sides["worker"] / sides["worker_elements"]
    assert ratios["worker_over_worker_elements"] == pytest.approx(want, rel=0.01)
    assert ratios["global_batch"] == 64 and ratios["workers"] == 2


def test_text_input_cpu_a_step_is_measured_on_the_input_alone():
    from tasks.lm.input import CorpusLmInput
    from tasks.lm.params.text import DATA
    from tools.benchmarks import text_input

    p = CorpusLmInput.Params().set(
        file_pattern=f"{DATA}/stories_dev.txt", seq_length=64, batch_size=4, shuffle_seed=1, repeat=True
    )
    p.vocab.set(file=f"{DATA}/stories.model", size=160)
    cpu = text_input._cpu_per_step(p, steps=30, rounds=2)
    assert 0 < cpu < 0.5  # seconds a batch: measured, and a packed batch of 4 x 64 is cheap


def test_a_users_corpus_is_named_as_the_trainer_names_it(tmp_path, capsys):
    """--gin_param and --params_override reach the experiment (a corpus of one's own; in this process,
    resolving only), and a bad one is one line with the trainer's exit status."""
    import gin

    corpus = tmp_path / "mine.txt"
    corpus.write_text("the old miller slept\n")
    args = input_benchmark._parse(
        [
            "input",
            "--model=lm.text.TextTransformerLM",
            f"--gin_param=TextTransformerLM.train_files='{corpus}'",
            "--params_override=input.train.seq_length : 48",
            "--batch_size=8",
        ]
    )
    try:
        train = input_benchmark._text_corpus_root(args).input.train
        assert (train.file_pattern, train.seq_length, train.batch_size) == (str(corpus), 48, 8)
        bad = ["input", "--model=lm.text.TextTransformerLM", "--params_override=input.train.seq_lenth : 4"]
        assert input_benchmark.main(bad) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("input: error: ") and "seq_length" in line
    finally:
        gin.clear_config()
