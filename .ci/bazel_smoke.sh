#!/usr/bin/env bash
# Bazel smoke test, fully offline: Debian's bazel-bootstrap (4.2.3) + the repo's virtualenv.
#   1. bazel run //trainer -- --model=image.digits.ConvNet --mode=inspect_params
#      must print the resolved Params (checked for task.train.learning_rate);
#   2. bazel test //tests/params/... must pass.
# Installs bazel-bootstrap with apt when no `bazel` is on PATH. Exits non-zero on any failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "bazel_smoke: $*"; }

if ! command -v bazel >/dev/null 2>&1; then
  say "no bazel on PATH: installing Debian's bazel-bootstrap"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends bazel-bootstrap >/dev/null
fi

if [[ ! -x .venv/bin/python3 ]]; then
  say "error: no virtualenv at $PWD/.venv (create it and install the requirements first)" >&2
  exit 1
fi
export PATH="$PWD/.venv/bin:$PATH"

# In CI, do not leave a Bazel server running after the script.
if [[ -n "${CI:-}" ]]; then
  trap 'bazel shutdown >/dev/null 2>&1 || true' EXIT
fi

ui=(--noshow_progress --show_result=0)

say "bazel run //trainer -- --model=image.digits.ConvNet --mode=inspect_params"
out_file=$(mktemp)
if ! bazel run "${ui[@]}" //trainer -- --model=image.digits.ConvNet --mode=inspect_params \
    >"$out_file"; then
  cat "$out_file"
  rm -f "$out_file"
  say "FAILED: bazel run //trainer" >&2
  exit 1
fi
if ! grep -q "task.train.learning_rate" "$out_file"; then
  cat "$out_file"
  rm -f "$out_file"
  say "FAILED: the inspect_params output has no task.train.learning_rate" >&2
  exit 1
fi
say "ok: $(grep -c ' : ' "$out_file") params printed, including task.train.learning_rate"
rm -f "$out_file"

say "bazel test //tests/params/..."
bazel test "${ui[@]}" //tests/params/...
say "ok"
