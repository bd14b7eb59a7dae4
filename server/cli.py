"""The ``ca-externalgrpc`` command: serve, validate, status."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from providers.config_errors import ConfigError

if TYPE_CHECKING:
    from server.app import RunningServer

log = logging.getLogger("server")
DISTRIBUTION = "ca-externalgrpc-server"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that states each option's default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if action.option_strings and default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run make install)"


def _configure_logging(fmt: str, level: str) -> None:
    try:
        from server.logs import configure_logging
    except ImportError:  # pragma: no cover - logs module is part of the package
        logging.basicConfig(level=level.upper())
        return
    configure_logging(fmt, level)


def cmd_serve(args: argparse.Namespace) -> int:
    from server import app, config

    try:
        cfg = config.load(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _configure_logging(args.log_format or cfg.log_format, args.log_level or cfg.log_level)
    try:
        running = app.start(cfg)
    except app.ListenError as err:
        print(f"error: {err}; choose another port with `{err.setting}` in {args.config}", file=sys.stderr)
        return 1
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.ready_file:
        try:
            write_ready_file(Path(args.ready_file), running)
        except OSError as err:
            print(f"error: cannot write --ready-file {args.ready_file}: {err.strerror or err}", file=sys.stderr)
            running.stop(grace=0)
            return 1
    app.run_until_signalled(running)
    return 0


def write_ready_file(path: Path, running: RunningServer) -> None:
    """``{"grpc": "host:port", "http": "host:port" | null, "pid": N}``, the bound addresses.

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    body = json.dumps({"grpc": running.address, "http": running.http_address, "pid": os.getpid()})
    partial = path.with_name(path.name + ".partial")
    partial.write_text(body + "\n")
    partial.replace(path)


def cmd_validate(args: argparse.Namespace) -> int:
    from server import config
    from server.cloud_config import check_cloud_config

    ok = True
    if args.config:
        try:
            cfg = config.load(args.config)
        except ConfigError as err:
            print(f"{args.config}: INVALID: {err}")
            ok = False
        else:
            names = ", ".join(f"{b.name} ({b.type}, {len(b.groups)} group override(s))" for b in cfg.backends)
            host, port = cfg.listen
            mode = "mTLS" if cfg.tls and cfg.tls.client_ca else "TLS" if cfg.tls else "plaintext"
            print(f"{args.config}: OK: listen {host}:{port} ({mode}); backends: {names}")
    if args.cloud_config:
        problems = check_cloud_config(Path(args.cloud_config))
        if problems:
            ok = False
            for problem in problems:
                print(f"{args.cloud_config}: INVALID: {problem}")
        else:
            print(f"{args.cloud_config}: OK: a valid CA externalgrpc cloud-config")
    if not args.config and not args.cloud_config:
        print("error: pass --config and/or --cloud-config", file=sys.stderr)
        return 2
    return 0 if ok else 1


def cmd_status(args: argparse.Namespace) -> int:
    from server.status import print_status

    return print_status(
        args.address,
        cert=args.cert,
        key=args.key,
        cacert=args.cacert,
        timeout=args.timeout,
        server_name=args.server_name,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ca-externalgrpc",
        description="cluster-autoscaler externalgrpc cloud-provider server",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    levels = ["debug", "info", "warning", "error"]

    serve = sub.add_parser(
        "serve",
        help="serve the CloudProvider gRPC API for the configured backends",
        formatter_class=DefaultsHelpFormatter,
    )
    serve.add_argument("--config", required=True, help="server YAML config file")
    serve.add_argument("--log-format", choices=["json", "text"], help="log format (default: log.format of the config)")
    serve.add_argument("--log-level", choices=levels, help="log level (default: log.level of the config)")
    serve.add_argument(
        "--ready-file",
        metavar="PATH",
        help="once the gRPC and HTTP ports are bound and the first sync is done, write the bound addresses "
        'there as JSON {"grpc": "host:port", "http": "host:port" or null, "pid": N}; with port 0 in the '
        "config this is how a supervisor or a test learns the ports the kernel chose",
    )
    serve.set_defaults(func=cmd_serve)

    validate = sub.add_parser(
        "validate",
        help="check a server config and/or a CA cloud-config without serving",
        formatter_class=DefaultsHelpFormatter,
    )
    validate.add_argument("--config", help="server YAML config file")
    validate.add_argument("--cloud-config", help="the CA's externalgrpc --cloud-config file")
    validate.set_defaults(func=cmd_validate)

    status = sub.add_parser(
        "status",
        help="print node groups, sizes and instances of a running server",
        formatter_class=DefaultsHelpFormatter,
    )
    status.add_argument("--address", metavar="HOST:PORT", default="127.0.0.1:8086", help="the server's gRPC host:port")
    status.add_argument("--cert", help="client certificate, PEM (mTLS)")
    status.add_argument("--key", help="client private key, PEM (mTLS)")
    status.add_argument("--cacert", help="CA bundle, PEM, that signed the server certificate (TLS)")
    status.add_argument(
        "--server-name", help="name to expect in the server certificate (e.g. when connecting via port-forward)"
    )
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each RPC")
    status.set_defaults(func=cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
