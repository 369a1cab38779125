"""The friction points a new user hit: dev.py's extra arguments and Ctrl-C, --log_dir, benchmark --help,
errors inside a user's experiment module, and list_models' doc lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from params import registry
from params.errors import ConfigError
from tests.trainer.runner import REPO, _env


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_dev_train_appends_extra_arguments_to_the_defaults():
    result = _run(
        [
            sys.executable,
            "tools/dev.py",
            "train",
            "--mode=inspect_params",
            "--params_override=task.train.max_steps : 7; task.train.warmup_steps : 1",
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "model : 'image.digits.ConvNet'" in result.stdout
    assert "task.train.max_steps : 7" in result.stdout


@pytest.mark.slow
def test_ctrl_c_during_dev_train_is_one_line_without_a_traceback(tmp_path):
    log = tmp_path / "out.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "tools/dev.py", "train", f"--logdir={tmp_path / 'run'}"],
            cwd=REPO,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
        try:
            deadline = time.monotonic() + 240
            while "trainer: watch it with" not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: every process of the group
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log.read_text()
    assert code == 130, text
    assert "trainer: interrupted" in text and "Traceback" not in text and "KeyboardInterrupt" not in text


def test_log_dir_typo_is_named():
    result = _run([sys.executable, "-m", "trainer", "--model=image.digits.ConvNet", "--log_dir=runs/x"])
    assert result.returncode == 2
    assert "did you mean --logdir?" in result.stderr.strip().splitlines()[-1]


def test_benchmark_help_lists_every_benchmarks_flags():
    result = _run([sys.executable, "-m", "tools.benchmark", "--help"])
    assert result.returncode == 0, result.stderr
    for name, flag in (("decode", "--length"), ("gpipe", "--figures"), ("train_overhead", "--steps")):
        assert f"== {name} ==" in result.stdout and flag in result.stdout, result.stdout


def test_an_import_error_inside_a_user_module_is_reported_as_such(tmp_path, monkeypatch):
    package = tmp_path / "user_exps_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text("import no_such_dependency_xyz\n")
    (package / "typo.py").write_text("x = undefined_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.PACKAGES_ENV, "tests,user_exps_pkg,not_a_pkg_xyz")  # the opt-in
    with pytest.raises(
        ConfigError, match="importing user_exps_pkg.broken failed: No module named 'no_such_dep"
    ):
        registry.get("user_exps_pkg.broken.MyExp")
    with pytest.raises(ConfigError, match="importing user_exps_pkg.typo failed: NameError"):
        registry.get("user_exps_pkg.typo.MyExp")
    with pytest.raises(ConfigError, match="unknown model .*PYTHONPATH"):
        registry.get("not_a_pkg_xyz.exps.MyExp")


def test_list_models_doc_lines_are_whole_sentences():
    result = _run([sys.executable, "-m", "tools.list_models"])
    line = next(x for x in result.stdout.splitlines() if x.startswith("lm.synthetic.GPipeTransformerLM"))
    assert line.rstrip().endswith("micro-batches per step."), line
