"""Run the operator: `boomerang-operator [--namespace NS ...] [--all-namespaces]`.

A thin front to `kopf run` with Boomerang's handlers, in standalone mode (one replica, no
peering objects needed), honouring in-cluster config or KUBECONFIG.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import kopf

from boomerang.operator import handlers


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)  # fmt: skip
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    assert handlers.reconcile_resource  # the import registers the handlers
    namespaces = [] if args.all_namespaces else args.namespace
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
