"""Local image builds for machines without an image registry: base stand-ins built from Debian's
packages and PyPI, the project's own Dockerfiles built on them with buildah (build.py), and the
archives imported into a kubelet's containerd (containerd.py)."""
