"""``python -m tools.checkpoint_state --logdir=DIR [--rebuild]``: the trainer's checkpoint state file.

Without ``--rebuild``: prints what ``DIR/train/checkpoint`` lists and the ``ckpt-<step>`` files present.
With ``--rebuild``: the recovery when that file is missing or damaged (the trainer then refuses to
start rather than train again from step 0): holding ``train/LOCK``, it moves a damaged file aside to
``checkpoint.damaged``, writes a new one listing every complete checkpoint present with the newest as
the latest, and touches nothing else. The next start resumes from that newest checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from params.errors import UserError
from trainer import tf_startup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.checkpoint_state", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--logdir", required=True, help="The run's --logdir.")
    parser.add_argument("--rebuild", action="store_true", help="Write the state file from the files present.")
    args = parser.parse_args(argv)
    tf_startup.import_tensorflow()
    try:
        return _run(args.logdir, args.rebuild)
    except UserError as e:
        print(f"checkpoint_state: error: {e}", file=sys.stderr)
        return e.exit_code


def _run(logdir: str, rebuild: bool) -> int:
    import tensorflow as tf

    from trainer import checkpointer, files
    from trainer.lock import TrainerLock

    train_dir = files.join(logdir, "train")
    present = checkpointer.checkpoints_on_disk(train_dir)
    state_path = files.join(train_dir, checkpointer.STATE_FILE)
    try:
        listed = checkpointer.list_checkpoints(train_dir)
        damaged = None
    except checkpointer.DamagedStateError as e:
        listed, damaged = [], str(e)
    print(f"checkpoints present: {', '.join(str(s) for s, _ in present) or 'none'}")
    if damaged:
        print(f"state file: damaged: {damaged.split(';')[0]}")
    elif not tf.io.gfile.exists(state_path):
        print("state file: missing")
    else:
        print(f"state file: lists {', '.join(str(s) for s, _ in listed) or 'none'}")
    if not rebuild:
        return 0
    with TrainerLock(train_dir, log=print):
        if damaged:
            tf.io.gfile.rename(state_path, state_path + ".damaged", overwrite=True)
            print(f"moved the damaged state file to {state_path}.damaged")
        written = checkpointer.rebuild_state(train_dir)
    print(
        f"wrote {state_path}: latest {written[-1][1]} ({len(written)} checkpoint(s)); training resumes there"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
