"""Build macros for TensorPipe.

Python targets use Bazel's native py rules and the `python3` found on PATH at run time (the
project's virtualenv: `source .venv/bin/activate` first), so every third-party package comes from
that environment and nothing is downloaded.
"""

_RUNNER = "//tests:pytest_runner.py"

def py_pytest_test(name, src, deps = [], data = [], size = "medium", **kwargs):
    """One py_test that runs the pytest file `src` through tests/pytest_runner.py.

    The package's other .py files (__init__.py, conftest.py, helpers such as fake_experiments.py,
    in sub-folders too) go with it, as do pyproject.toml and tests/conftest.py, so pytest sees
    the same tree and settings as a plain `pytest` run.

    Args:
      name: target name.
      src: the test_*.py file, in this package.
      deps: py_library targets the test imports (e.g. "//params", "//tests/tasks:loop").
      data: extra runtime files.
      size: Bazel test size, which sets the timeout. "medium" (300 s) because tests/conftest.py
        imports TensorFlow, which alone can take many seconds on a busy 2-core machine.
      **kwargs: passed to py_test (tags, timeout, flaky, shard_count ...).
    """
    native.py_test(
        name = name,
        srcs = [src, _RUNNER] + native.glob(["**/*.py"], exclude = ["**/test_*.py"]),
        main = _RUNNER,
        args = ["$(rootpath %s)" % src],
        deps = deps,
        data = data + [
            "//:pytest_config",
            "//tests:pytest_support",
        ],
        python_version = "PY3",
        srcs_version = "PY3",
        size = size,
        **kwargs
    )

def py_pytest_tests(deps = [], srcs = None, data = [], size = "medium", **kwargs):
    """One py_pytest_test per test file, named after its path without .py (test_x, image/test_y).

    srcs defaults to every test_*.py in this package and its sub-folders: one BUILD file per
    top-level test folder is enough, and a new test file is picked up without editing it.
    A test that imports helpers from another test package depends on a py_library there
    (e.g. "//tests/params:fake_experiments").
    """
    if srcs == None:
        srcs = native.glob(["**/test_*.py"])
    for src in srcs:
        py_pytest_test(
            name = src[:-len(".py")],
            src = src,
            deps = deps,
            data = data,
            size = size,
            **kwargs
        )
