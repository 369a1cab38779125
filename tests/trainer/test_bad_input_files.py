"""Files a run names that are not what they should be: the real binaries refuse each with one line
and a non-zero exit, naming the file or the param, and write nothing."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from params import experiment
from tests.trainer import runner

GPIPE = "image.digits.GPipeConvNet"


def _damaged_params(tmp_path, key: str, value: str):
    """A log directory whose params.txt (GPipeConvNet's) holds ``key : value``."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    text = experiment.resolve(GPIPE).to_text()
    text, count = re.subn(rf"^({re.escape(key)} : ).*$", lambda m: m[1] + value, text, flags=re.M)
    assert count == 1
    (logdir / "params.txt").write_text(text)
    return logdir


def _schedule(tmp_path, content: bytes | None):
    path = tmp_path
    if content is not None:
        path = tmp_path / "schedule.csv"
        path.write_bytes(content)
    return [f"--params_override=task.body.sub[0].schedule_file : '{path}'"]


CASES = {
    "vocab_file_a_directory": (
        lambda tmp: (
            [
                "trainer",
                "--model=lm.text.TextTransformerLM",
                f"--gin_param=TextTransformerLM.vocab_file='{tmp}'",
            ],
            None,
        ),
        1,
        "is a directory, not a SentencePiece .model file",
    ),
    "schedule_file_a_directory": (
        lambda tmp: (["trainer", f"--model={GPIPE}", *_schedule(tmp, None)], None),
        2,
        "is a directory, not a CSV file",
    ),
    "schedule_file_not_utf8": (
        lambda tmp: (["trainer", f"--model={GPIPE}", *_schedule(tmp, b"\xff\xfe0F0\n")], None),
        2,
        "schedule.csv is not UTF-8 text",
    ),
    "schedule_file_a_5000_digit_number": (
        lambda tmp: (["trainer", f"--model={GPIPE}", *_schedule(tmp, b"0F" + b"1" * 5000 + b",1F0\n")], None),
        2,
        "schedule.csv: Exceeds the limit",
    ),
    "export_a_float_for_an_int": (
        lambda tmp: (["tools.export"], _damaged_params(tmp, "task.body.sub[0].num_stages", "2.5")),
        1,
        "param 'task.body.sub[0].num_stages': expected an int",
    ),
    "export_a_string_for_an_int": (
        lambda tmp: (["tools.export"], _damaged_params(tmp, "task.body.sub[0].num_micro_batches", "'four'")),
        1,
        "param 'task.body.sub[0].num_micro_batches': expected an int",
    ),
    "train_on_over_an_ill_typed_params_txt": (
        lambda tmp: (
            ["trainer", f"--model={GPIPE}", "--params_override=task.train.max_steps : 3000"],
            _damaged_params(tmp, "task.body.sub[0].num_stages", "2.5"),
        ),
        2,
        "its params.txt is damaged (param 'task.body.sub[0].num_stages': expected an int",
    ),
}


def _tree(path):
    return {str(p.relative_to(path)): p.is_file() and p.read_bytes() for p in sorted(path.rglob("*"))}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_file_is_one_line_and_nothing_is_written(tmp_path, case):
    make, code, words = CASES[case]
    (binary, *flags), logdir = make(tmp_path)
    logdir = logdir or tmp_path / "run"
    before = _tree(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", binary, f"--logdir={logdir}", *flags],
        cwd=runner.REPO,
        env=runner._env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr[-2000:]
    assert len(lines) == 1 and words in lines[0], result.stderr[-2000:]
    assert _tree(tmp_path) == before  # nothing written, the damaged params.txt left as it was
