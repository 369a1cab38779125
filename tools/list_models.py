"""``python -m tools.list_models``: every registered experiment key with its doc line."""

from __future__ import annotations

import sys

from params import registry
from trainer import tf_startup


def main() -> int:
    tf_startup.import_tensorflow()
    keys = registry.all_keys()
    width = max((len(k) for k in keys), default=0)
    for key in keys:
        print(f"{key:<{width}}  {registry.doc_line(registry.get(key))}")
    if not keys:
        print("no experiments registered", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
