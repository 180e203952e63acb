"""The resource's identity and the limits its name must respect.

Why a module of its own: the group, version and kind, the release's image names and the longest
`metadata.name` whose children all fit are read by the CRD generator, the builders and the
admission rules alike, and none of them depends on the spec's types.
"""

from __future__ import annotations

from boomerang.facts.engine import ROLES

GROUP = "boomerang.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DisaggregatedDeployment"
PLURAL = "disaggregateddeployments"
SINGULAR = "disaggregateddeployment"
SHORT_NAMES = ["dd", "disagg"]

IMAGE_REGISTRY = "ghcr.io/boomerang-dev"
"""Where the release workflow publishes the images (the chart's `image.registry` names it too)."""
IMAGE_TAG = "0.1.0"
"""The images of this release: the project's version and the chart's appVersion (tested)."""
DEFAULT_ENGINE_IMAGE = f"{IMAGE_REGISTRY}/connector:{IMAGE_TAG}"
DEFAULT_ROUTER_IMAGE = f"{IMAGE_REGISTRY}/router:{IMAGE_TAG}"

DNS_LABEL_MAX = 63
"""Kubernetes' limit on a DNS label: Service and StatefulSet names, pod hostnames, label values."""
DNS_SUBDOMAIN_MAX = 253
"""Kubernetes' limit on the other names (ConfigMaps, Deployments, RBAC, policies)."""
INT32_MAX = 2**31 - 1
"""StatefulSets' and Deployments' replica counts are int32s."""
STATEFULSET_SUFFIX_MAX = len(f"-{INT32_MAX - 1}")
"""The most Kubernetes appends to a StatefulSet's name, 11 characters: its pods are named
`<statefulset>-<ordinal>` (ordinals below replicas <= INT32_MAX have 10 digits at most), and are
labelled `controller-revision-hash: <statefulset>-<hash>` (a 32-bit hash, encoded in at most 10
characters). Both must stay DNS labels: a pod's name is its hostname and a label value."""
_STATEFULSET_SUFFIXES = tuple(f"-{role}" for role in ROLES)
_SERVICE_SUFFIXES = (*_STATEFULSET_SUFFIXES, "-router")
CHILD_SUFFIXES = (*_SERVICE_SUFFIXES, "-engines", "-lease-token")
"""What the operator appends to the resource's name for its children (`render.child_name`): the
roles' StatefulSets and headless Services, the router's objects, the engines' NetworkPolicy,
the lease token's Secret."""
MAX_NAME_LENGTH = min(
    DNS_LABEL_MAX,  # the name itself is a label value (app.kubernetes.io/instance)
    DNS_LABEL_MAX - max(map(len, _SERVICE_SUFFIXES)),  # Services: 63 - 8 = 55
    DNS_LABEL_MAX - max(map(len, _STATEFULSET_SUFFIXES)) - STATEFULSET_SUFFIX_MAX,  # 63-8-11
    DNS_SUBDOMAIN_MAX - max(map(len, CHILD_SUFFIXES)),  # everything else: 253 - 8 = 245
)
"""The longest `metadata.name` whose children all fit: 44, set by the prefill StatefulSet's pods
and revision labels (63 - len("-prefill") - 11). Longer names are refused at admission
(`NAME_RULES`): the API server would otherwise admit them, and then refuse some children only."""
