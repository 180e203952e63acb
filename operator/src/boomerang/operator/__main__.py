"""Run the operator: `boomerang-operator [--namespace NS ...] [--peering NAME]`.

A thin front to `kopf run` with Boomerang's handlers, honouring in-cluster config or KUBECONFIG.

Without `--peering` the operator runs standalone: no peering objects needed, for local runs and
single-replica installs. With `--peering NAME` several replicas run at once and only one acts:
kopf's peering has every replica write a heartbeat (its priority and lifetime) into the
ClusterKopfPeering NAME (cluster-wide) or the KopfPeering NAME in each watched namespace; the
live replica with the highest priority runs, the others pause until its heartbeat expires.
Equal priorities would pause all of them, so each replica picks a random one unless told.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
from typing import Any, cast

import kopf

from boomerang.operator import handlers, metrics, policy

PEERING_LIFETIME_S = 60  # kopf's default: how long a silent leader is waited for


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="boomerang-operator", description=__doc__)
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="watch every namespace (the default without --namespace)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=metrics.PORT,
        help=f"serve Prometheus metrics here (default {metrics.PORT}; 0: off)",
    )
    parser.add_argument(
        "--metrics-namespace",
        metavar="NS",
        default=None,
        help="let this namespace's pods scrape the engines' HTTP port "
        f"(env {policy.PROMETHEUS_NAMESPACE_ENV})",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="leader election through kopf's peering object NAME; default: standalone",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority, the highest live one leads; default: random",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=int,
        default=PEERING_LIFETIME_S,
        metavar="SECONDS",
        help=f"how long a heartbeat counts (default {PEERING_LIFETIME_S}): a killed leader's "
        "successor waits this long",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    assert handlers.reconcile_resource  # the import registers the handlers
    namespaces = [] if args.all_namespaces else args.namespace
    if args.metrics_namespace:
        os.environ[policy.PROMETHEUS_NAMESPACE_ENV] = args.metrics_namespace
    metrics.serve(handlers.METRICS, args.metrics_port)
    settings = kopf.OperatorSettings()
    settings.peering.lifetime = args.peering_lifetime
    priority = args.priority
    if args.peering and priority is None:
        priority = random.SystemRandom().randint(1, 2**31 - 1)
    if args.peering:
        logging.getLogger("boomerang.operator").info(
            "Joining peering name=%s priority=%d", args.peering, priority
        )
    pod_name = os.environ.get("POD_NAME")
    asyncio.run(
        kopf.operator(
            settings=settings,
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=priority,
            # kopf types the identity as a private NewType of str; None: user@host/time.
            identity=cast(Any, pod_name) if pod_name else None,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
