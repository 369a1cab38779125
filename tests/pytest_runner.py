"""Runs one pytest file as a Bazel py_test: ``pytest_runner.py tests/<pkg>/test_x.py``.

The exit status is pytest's, so a failing, erroring or empty test file fails the Bazel test.
Bazel's test environment is mapped onto pytest's options: the JUnit XML goes where Bazel reads it
(XML_OUTPUT_FILE) and ``bazel test --test_filter=EXPR`` becomes ``-k EXPR``.
"""

from __future__ import annotations

import os
import sys

import pytest


def pytest_args(argv: list[str], env: dict[str, str]) -> list[str]:
    args = [*argv, "-q", "-p", "no:cacheprovider"]  # the runfiles tree is no place for a cache
    if env.get("XML_OUTPUT_FILE"):
        args.append(f"--junitxml={env['XML_OUTPUT_FILE']}")
    if env.get("TESTBRIDGE_TEST_ONLY"):
        args += ["-k", env["TESTBRIDGE_TEST_ONLY"]]
    return args


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: pytest_runner.py TEST_FILE [PYTEST_ARGS...]")
    sys.exit(pytest.main(pytest_args(sys.argv[1:], dict(os.environ))))
