"""trainer.tf_startup: freed tensor memory goes back to the operating system."""

import json
import os
import subprocess
import sys
from pathlib import Path

from trainer import tf_startup

ROOT = Path(__file__).resolve().parents[2]

# A fresh process (the allocator is chosen once per process): resident MiB with a 64 MiB tensor
# alive, then after it is freed.
FREED = """
import json
from trainer import tf_startup
tf_startup.use_system_allocator()
tf = tf_startup.import_tensorflow()

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

x = tf.fill([16 * 2**20], 1.0)
float(tf.reduce_sum(x))
held = rss_mib()
del x
print(json.dumps({"held": held, "freed": rss_mib()}))
"""


def test_use_system_allocator_sets_the_variable_and_keeps_a_users_choice():
    environ = {}
    tf_startup.use_system_allocator(environ)
    assert environ == {tf_startup.SYSTEM_ALLOCATOR_ENV: "1"}
    chosen = {tf_startup.SYSTEM_ALLOCATOR_ENV: "0"}
    tf_startup.use_system_allocator(chosen)
    assert chosen == {tf_startup.SYSTEM_ALLOCATOR_ENV: "0"}


def test_a_freed_tensor_leaves_resident_memory():
    """Under oneDNN's pool (TF_ONEDNN_USE_SYSTEM_ALLOCATOR=0) the 64 MiB stay resident after the
    tensor is freed; with use_system_allocator they go back to the OS."""
    env = {k: v for k, v in os.environ.items() if k != tf_startup.SYSTEM_ALLOCATOR_ENV}
    result = subprocess.run(
        [sys.executable, "-c", FREED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    rss = json.loads(result.stdout.strip().splitlines()[-1])
    assert rss["held"] - rss["freed"] > 48, rss
