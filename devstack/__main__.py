"""``python -m devstack`` (what ``make run`` runs): the demo, the server in front of both simulated clouds."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from devstack.demo import banner, start_demo
from server import app
from server.cli import DefaultsHelpFormatter
from server.logs import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devstack",
        description="serve the CloudProvider API against the simulated Scaleway and Bizfly clouds "
        "(no credentials, no cloud account); make run starts this",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", default="127.0.0.1:8086", help="gRPC host:port (make run LISTEN=...)"
    )
    parser.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        default="127.0.0.1:8087",
        help="host:port of /healthz, /readyz, /metrics (make run HTTP_LISTEN=...)",
    )
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall-clock second")
    parser.add_argument("--log-format", choices=["json", "text"], default="text", help="server log format")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="server log level"
    )
    return parser


# Where a busy port is changed, by the config key the server reports.
PORT_FLAGS = {
    "listen": "--listen HOST:PORT (make run LISTEN=HOST:PORT)",
    "http_listen": "--http-listen HOST:PORT (make run HTTP_LISTEN=HOST:PORT)",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        demo = start_demo(args.listen, args.http_listen, speed=args.speed)
    except app.ListenError as err:
        print(f"error: {err}; choose another port with {PORT_FLAGS[err.setting]}", file=sys.stderr)
        return 1
    print(banner(demo), flush=True)
    try:
        app.run_until_signalled(demo.running)
    finally:
        demo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
