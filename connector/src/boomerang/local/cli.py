"""`boomerang`: run the product locally (`up`, `down`, `status`, `demo`).

`boomerang up MANIFEST` starts every prefill and decode replica and the router as local
processes from a `DisaggregatedDeployment` manifest (see `boomerang.local.stack`);
`boomerang demo MANIFEST` does the same if needed, then runs a short multi-turn chat and prints
per-turn TTFT and reuse. The stack stays up after `demo` (a second demo reuses it);
`boomerang down` stops it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from boomerang.local import stack


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="boomerang", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("up", "start the local stack"), ("demo", "start if needed, then chat")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument(
            "manifest",
            type=Path,
            nargs="?",
            default=stack.DEFAULT_MANIFEST,
            help="a DisaggregatedDeployment YAML file (default: the built-in local CPU stack)",
        )
        cmd.add_argument("--port", type=int, default=8080, help="router port (default 8080)")
    sub.add_parser("down", help="stop the local stack")
    sub.add_parser("status", help="show the local stack")
    return p


def _up(manifest: Path, port: int) -> str:
    endpoint: str = stack.up(manifest, stack.LocalPorts(router=port))
    print(f"Boomerang is up: OpenAI endpoint {endpoint}")
    return endpoint


def _demo(manifest: Path, port: int) -> None:
    try:
        import openai  # noqa: F401
    except ImportError as exc:  # the client is an extra
        raise RuntimeError("the demo needs the client: pip install 'boomerang[demo]'") from exc
    from boomerang.local import demo

    state = stack.status()
    if not (state and state.get("engines") and all(p["alive"] for p in state["processes"])):
        if state:
            stack.down(log=lambda _m: None)
        _up(manifest, port)
        state = stack.status()
        assert state is not None
    else:
        print(f"Using the running stack at {state['endpoint']}")
    endpoint = state["endpoint"]
    results = demo.run_conversation(endpoint, state["model"], state["engines"]["prefill"])
    print(demo.format_table(results))
    print(f"The stack is still up at {endpoint}; `boomerang down` stops it.")


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            _up(args.manifest, args.port)
        elif args.command == "demo":
            _demo(args.manifest, args.port)
        elif args.command == "down":
            stack.down()
        else:
            print(json.dumps(stack.status(), indent=2))
    except (ValueError, RuntimeError) as exc:
        print(f"boomerang: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
