"""A sample of fuzzed configuration input through the real binary, one process per input.

``python -m trainer --mode=inspect_params`` gets one generated ``--params_override``,
``--params_file_override`` (raw bytes), ``--gin_param``, ``--gin_file`` or ``--job``: the exit status is
0 or 2, stderr holds no traceback, and a canary module that a payload names is never imported. Each
run starts TensorFlow (seconds), so the suite runs ``TENSORPIPE_CLI_FUZZ_EXAMPLES`` inputs (default 5:
one per flag, the flags taken in turn); ``TENSORPIPE_CLI_FUZZ_EXAMPLES=200`` is the full sample.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.params import fuzz_inputs
from tests.trainer import runner

EXAMPLES = int(os.environ.get("TENSORPIPE_CLI_FUZZ_EXAMPLES", "5"))
WORKERS = int(os.environ.get("TENSORPIPE_CLI_FUZZ_WORKERS", "2"))
FLAGS = ["--params_override", "--params_file_override", "--gin_param", "--gin_file", "--job"]


def _argv_safe(text: str) -> str:
    """What a command line can carry: no NUL, only encodable characters."""
    text = text.replace("\x00", "")
    return (
        text.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
        if _encodable(text)
        else "x"
    )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


_text = st.one_of(fuzz_inputs.text, fuzz_inputs.gin_text)


def _run_one(case, directory, index, env):
    flag, text = case
    argv = [sys.executable, "-m", "trainer", f"--model={fuzz_inputs.MODEL}", "--mode=inspect_params"]
    if flag in ("--params_file_override", "--gin_file"):
        path = directory / f"input-{index}.txt"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        argv.append(f"{flag}={path}")
    else:
        argv.append(f"{flag}={_argv_safe(text)}")
    proc = subprocess.run(argv, cwd=runner.REPO, env=env, capture_output=True, timeout=300)
    print(f"cli fuzz run {index}: {flag} -> exit {proc.returncode}", flush=True)  # shown with -s
    return case, proc.returncode, proc.stderr.decode("utf-8", "replace")


def _generated_cases(count: int) -> list:
    """``count`` distinct inputs drawn by hypothesis (generation only: each is a process to run), the
    flags in turn."""
    cases: list = []

    @settings(
        max_examples=count * 3,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(_text)
    def collect(text):
        case = (FLAGS[len(cases) % len(FLAGS)], text)
        if case not in cases and len(cases) < count:
            cases.append(case)

    collect()
    return cases


@pytest.mark.slow
def test_fuzzed_flags_exit_0_or_2_without_traceback(tmp_path_factory):
    cases = _generated_cases(EXAMPLES)
    assert len(cases) == EXAMPLES
    directory = tmp_path_factory.mktemp("cli_fuzz")
    marker = directory / "imported"
    (directory / f"{fuzz_inputs.CANARY}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Thing: pass\n"
    )
    env = runner._env()
    env["PYTHONPATH"] = str(directory) + os.pathsep + env["PYTHONPATH"]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        results = list(pool.map(lambda ic: _run_one(ic[1], directory, ic[0], env), enumerate(cases)))
    codes = {}
    for case, code, stderr in results:
        codes[code] = codes.get(code, 0) + 1
        assert code in (0, 2), (case, code, stderr[-2000:])
        assert "Traceback" not in stderr, (case, stderr[-2000:])
        if code == 2:
            assert len(runner.error_lines(stderr)) == 1, (case, stderr[-2000:])
    print(f"CLI fuzz: {len(results)} runs, exit codes {codes}")
    assert not marker.exists(), "a payload imported the canary module"
