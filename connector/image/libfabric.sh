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
# boomerang.connector.image_check).
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

install_efa_installer() {
  local dir
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
  (cd "$dir/aws-efa-installer" && ./efa_installer.sh "${flags[@]}")
  rm -rf "$dir" /var/lib/apt/lists/*
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
