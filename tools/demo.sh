#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs rw on the embedded tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
b=${RW_BUILD_DIR:-build}
echo "== checkpoint: tests/fixtures/qwen3-moe-tiny"
"$b/tools/ckpt/rw-ckpt" inspect tests/fixtures/qwen3-moe-tiny
