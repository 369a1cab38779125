"""The benchmarks of ``python -m tools.benchmark``; a module also runs as its own worker process."""

import sys

if sys.argv[:1] == ["-m"]:  # a worker, python -m tools.benchmarks.<name>: TensorFlow as binaries import it
    from trainer import tf_startup

    tf_startup.import_tensorflow()
