#!/usr/bin/env bash
# Builds the operator, router and connector images with buildah from their own Dockerfiles on
# bases made here (cached; see README.md beside this script), e.g.
#   bash e2e/images/build.sh [operator|router|connector ...] [--import CONTAINERD_SOCKET]
# Needs Python 3.11+ (PYTHON, default python3; the standard library only).
set -euo pipefail
E2E="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHONPATH="$E2E${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" -m images.build "$@"
