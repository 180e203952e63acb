#!/usr/bin/env bash
# The libraries NIXL's LIBFABRIC plugin (its EFA transport) links, for connector/Dockerfile:
# libfabric and hwloc. NIXL's wheels bundle neither, and vLLM's image has neither.
#
#   LIBFABRIC=efa-installer (the default): AWS's EFA installer, user-space part only: libfabric
#     with the efa provider, in /opt/amazon/efa. The tarball is verified before anything is
#     unpacked: its GPG signature must be valid and made by the key whose fingerprint is pinned
#     (EFA_INSTALLER_KEY_FINGERPRINT, AWS's), and, when EFA_INSTALLER_SHA256 is given, its
#     SHA-256 must match. Either failing fails the build. Then libfabric must carry the efa
#     provider.
#   LIBFABRIC=distribution: the base distribution's libfabric1 (no efa provider): for nodes
#     without EFA, and for builds that cannot reach AWS (e2e/images builds it so).
#
# Both install the distribution's libhwloc15, and binutils for `readelf`. The Dockerfile then
# checks with `ldd` that every library of the plugin resolves, and with `readelf -V` that the
# libfabric.so.1 it resolves defines every symbol version the plugin needs (NIXL 1.5.1's plugin
# needs FABRIC_1.10: libfabric >= 2.7, hence the Dockerfile's pin of the installer;
# boomerang.connector.launch.image_check).
#
#   bash libfabric.sh [install]   # in the image build, as root
#   bash libfabric.sh verify      # anywhere with curl and gpgv: fetch and verify the pinned
#                                 # installer, print its SHA-256 (the release workflow does)
set -euo pipefail

LIBFABRIC="${LIBFABRIC:-efa-installer}"
: "${EFA_INSTALLER_VERSION:?the EFA installer version (connector/Dockerfile pins it)}"
: "${EFA_INSTALLER_BASE_URL:?where AWS publishes the installer}"
: "${EFA_INSTALLER_KEY_FINGERPRINT:?the fingerprint of the signing key of AWS}"
EFA_INSTALLER_SHA256="${EFA_INSTALLER_SHA256:-}"
TARBALL="aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz"

say() { echo "libfabric: $*" >&2; }
fail() { say "$*"; exit 1; }

# Fetch the tarball, its signature and the signing key into $1; verify; print the SHA-256.
fetch_verified() {
  local dir="$1" pinned status signer sha
  pinned="$(tr -d ' ' <<<"${EFA_INSTALLER_KEY_FINGERPRINT}" | tr 'a-f' 'A-F')"
  [[ "$pinned" =~ ^[0-9A-F]{40}$ ]] || fail "EFA_INSTALLER_KEY_FINGERPRINT is not a fingerprint"
  if [[ -n "$EFA_INSTALLER_SHA256" && ! "$EFA_INSTALLER_SHA256" =~ ^[0-9a-f]{64}$ ]]; then
    fail "EFA_INSTALLER_SHA256 must be 64 lowercase hex digits"
  fi
  curl -fsSL "${EFA_INSTALLER_BASE_URL}/${TARBALL}" -o "$dir/$TARBALL"
  curl -fsSL "${EFA_INSTALLER_BASE_URL}/${TARBALL}.sig" -o "$dir/$TARBALL.sig"
  curl -fsSL "${EFA_INSTALLER_BASE_URL}/aws-efa-installer.key" -o "$dir/key"
  # gpgv (which apt itself uses) checks the signature against a keyring holding only the
  # downloaded key, de-armored here: no keyring of the system's, no gpg-agent.
  if grep -q -- '-----BEGIN PGP' "$dir/key"; then
    sed '1,/^$/d; /^=/d; /^-----END/d' "$dir/key" | base64 -d >"$dir/keyring.gpg" \
      || fail "cannot read the signing key from ${EFA_INSTALLER_BASE_URL}"
  else
    cp "$dir/key" "$dir/keyring.gpg"
  fi
  # VALIDSIG's last field is the primary key's fingerprint: the signature is good and made
  # by that key (or one of its subkeys). Nothing else counts, whatever the key file holds.
  status="$(gpgv --keyring "$dir/keyring.gpg" --status-fd 1 "$dir/$TARBALL.sig" "$dir/$TARBALL" \
    2>/dev/null || true)"
  signer="$(awk '$2 == "VALIDSIG" {print $NF}' <<<"$status")"
  [[ -n "$signer" ]] || fail "$TARBALL: no valid signature (refusing to unpack it)"
  [[ "$signer" == "$pinned" ]] || fail "$TARBALL: signed by $signer, not by $pinned (refusing)"
  sha="$(sha256sum "$dir/$TARBALL" | cut -d' ' -f1)"
  if [[ -n "$EFA_INSTALLER_SHA256" && "$sha" != "$EFA_INSTALLER_SHA256" ]]; then
    fail "$TARBALL: SHA-256 $sha, not the expected $EFA_INSTALLER_SHA256 (refusing)"
  fi
  say "$TARBALL: signature by $signer verified; SHA-256 $sha"
  echo "$sha"
}

apt_install() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Whether the installer's help lists `flag` as an option of its own (not inside another's).
has_flag() {
  grep -qE -- "(^|[[:space:],|])${2}([[:space:],=|]|$)" <<<"$1"
}

# The NGC setting for vLLM's base, NVIDIA's CUDA image: installers from 1.48.0 take such an
# image for an "NGC build image" and skip rdma-core, and libfabric1-aws then cannot meet its
# dependency on ibverbs-providers (>= 59; Ubuntu 22.04 offers 39). The flag's name is not
# settled by public sources: an AWS project turns the mode off with --disable-build-ngc,
# NVIDIA Dynamo's install script passes --build-ngc, AWS's container page documents
# --enable-ngc (1.49.0 on). So the installer's own help decides: a flag that turns NGC mode
# off is passed when the help lists one; where the help offers NGC mode only as an opt-in,
# nothing is passed. Either way `check_packages` fails the build if rdma-core was skipped.
NGC_OFF_FLAGS=(--disable-build-ngc --disable-ngc --no-build-ngc --no-ngc)

# Every package libfabric needs from the installer, installed, and new enough: libfabric1-aws
# >= 2.7 (NIXL's plugin needs FABRIC_1.10), and each of its versioned dependencies on
# rdma-core (ibverbs-providers, libibverbs1) met, as its own Depends field states them.
check_packages() {
  local pkg version dep name op need have
  for pkg in ibverbs-providers libibverbs1; do
    version="$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$pkg" 2>/dev/null || true)"
    [[ "$version" == installed\ * ]] \
      || fail "$pkg is not installed after the EFA installer ran (in NGC mode it skips rdma-core)"
  done
  version="$(dpkg-query -W -f='${Version}' libfabric1-aws 2>/dev/null || true)"
  [[ -n "$version" ]] || fail "libfabric1-aws is not installed after the EFA installer ran"
  while IFS= read -r dep; do
    [[ "$dep" =~ ^[[:space:]]*(ibverbs-providers|libibverbs1)[[:space:]]*\(([<>=]+)[[:space:]]*([^\)]+)\) ]] \
      || continue
    name="${BASH_REMATCH[1]}" op="${BASH_REMATCH[2]}" need="${BASH_REMATCH[3]}"
    have="$(dpkg-query -W -f='${Version}' "$name")"
    case "$op" in ">=") op=ge ;; ">>") op=gt ;; "=") op=eq ;; "<=") op=le ;; "<<") op=lt ;; esac
    dpkg --compare-versions "$have" "$op" "$need" \
      || fail "$name $have does not meet libfabric1-aws's dependency ($name $op $need)"
  done < <(dpkg-query -W -f='${Depends}' libfabric1-aws | tr ',' '\n')
  [[ "$(dpkg-query -W -f='${db:Status-Status}' libfabric1-aws)" == installed ]] \
    || fail "libfabric1-aws $version is not configured: $(dpkg --audit 2>&1 | head -3)"
  dpkg --compare-versions "$version" ge 2.7 \
    || fail "libfabric1-aws $version is older than 2.7, which NIXL's LIBFABRIC plugin needs"
  if [[ -n "$(dpkg --audit 2>&1)" ]]; then
    fail "packages left unconfigured after the EFA installer: $(dpkg --audit 2>&1 | head -5)"
  fi
  say "libfabric1-aws $version, ibverbs-providers $(dpkg-query -W -f='${Version}' \
ibverbs-providers), libibverbs1 $(dpkg-query -W -f='${Version}' libibverbs1)"
}

install_efa_installer() {
  local dir help flag output
  # The installer's prerequisites, gpgv for the signature, binutils for the image check's
  # readelf; they follow the base's release.
  apt_install curl ca-certificates gpgv pciutils environment-modules libhwloc15 binutils
  dir="$(mktemp -d)"
  fetch_verified "$dir" >/dev/null
  tar -xzf "$dir/$TARBALL" -C "$dir"
  # The flags of a container install. No -g (--enable-gdr): the installer's README describes it
  # as a kernel module variant for GPUDirect, which --skip-kmod leaves out anyway.
  local flags=(
    -y                 # no questions (the installer's README, "Installer Usage")
    --skip-kmod        # no kernel module: the node's EFA driver serves the pod (AWS EC2 User
                       # Guide, "Install the EFA software in a container")
    --skip-limit-conf  # no locked-memory limit files: the pod's limits apply (same page)
    --no-verify        # no device test: a build has no EFA device (same page)
    --skip-mpi         # no Open MPI: NIXL does not use it (NVIDIA Dynamo's container EFA
                       # install script, container/deps/efa/install_efa.sh)
  )
  # Each flag must be one this installer has: its own -h says so, not a public page.
  help="$(cd "$dir/aws-efa-installer" && ./efa_installer.sh -h 2>&1 || true)"
  for flag in "${flags[@]}"; do
    has_flag "$help" "$flag" \
      || fail "efa_installer.sh ${EFA_INSTALLER_VERSION} has no flag $flag (not in its -h)"
  done
  for flag in "${NGC_OFF_FLAGS[@]}"; do
    if has_flag "$help" "$flag"; then
      flags+=("$flag")
      say "NGC mode turned off with $flag (the installer's -h lists it)"
      break
    fi
  done
  output="$(cd "$dir/aws-efa-installer" && ./efa_installer.sh "${flags[@]}" 2>&1)" \
    || { echo "$output" >&2; fail "efa_installer.sh failed"; }
  echo "$output" >&2
  if grep -qi 'ngc' <<<"$output"; then
    say "the installer says of NGC: $(grep -i 'ngc' <<<"$output" | head -3 | tr '\n' ' ')"
  else
    say "the installer ran without NGC mode"
  fi
  rm -rf "$dir" /var/lib/apt/lists/*
  check_packages
  # libfabric must load and carry the efa provider: built in (listed by `fi_info --list`,
  # which needs no EFA device) or as a provider library.
  /opt/amazon/efa/bin/fi_info --version
  if /opt/amazon/efa/bin/fi_info --list | grep -x 'efa:' >/dev/null \
      || compgen -G '/opt/amazon/efa/lib/libfabric/libefa-fi.so*' >/dev/null; then
    say "libfabric's efa provider is present"
  else
    fail "the EFA installer ran, but libfabric has no efa provider"
  fi
}

install_distribution() {
  apt_install libfabric1 libhwloc15 binutils
  rm -rf /var/lib/apt/lists/*
  say "the distribution's libfabric1 and libhwloc15 (no efa provider)"
}

case "${1:-install}" in
  verify) fetch_verified "$(mktemp -d)" ;;
  install)
    case "$LIBFABRIC" in
      efa-installer) install_efa_installer ;;
      distribution) install_distribution ;;
      *) fail "LIBFABRIC must be efa-installer or distribution, not '$LIBFABRIC'" ;;
    esac ;;
  *) fail "usage: libfabric.sh [install|verify]" ;;
esac
