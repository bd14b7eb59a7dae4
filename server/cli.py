"""The ``ca-externalgrpc`` command: serve, validate, demo, status."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from providers.config_errors import ConfigError

log = logging.getLogger("server")


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
    running = app.start(cfg)
    app.run_until_signalled(running)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from server.cloud_config import check_cloud_config
    from server.config import validate_file

    if not args.config and not args.cloud_config:
        print("error: pass --config and/or --cloud-config", file=sys.stderr)
        return 2
    ok = True
    offline = " (offline: shape only)" if args.offline else ""
    if args.config:
        result = validate_file(args.config, offline=args.offline)
        if result.problems:
            ok = False
            count = len(result.problems)
            print(f"{args.config}: INVALID: {count} problem{'s' if count > 1 else ''}")
            for mistake in result.problems:
                print(f"  - {mistake}")
        elif result.config is None:
            print(f"{args.config}: OK{offline}")
        else:
            cfg = result.config
            names = ", ".join(f"{b.name} ({b.type}, {len(b.groups)} group override(s))" for b in cfg.backends)
            host, port = cfg.listen
            mode = "mTLS" if cfg.tls and cfg.tls.client_ca else "TLS" if cfg.tls else "plaintext"
            print(f"{args.config}: OK{offline}: listen {host}:{port} ({mode}); backends: {names}")
        for unchecked in result.unchecked:
            print(f"  not checked: {unchecked}")
    if args.cloud_config:
        check = check_cloud_config(Path(args.cloud_config), offline=args.offline)
        if check.problems:
            ok = False
            for problem in check.problems:
                print(f"{args.cloud_config}: INVALID: {problem}")
        else:
            print(f"{args.cloud_config}: OK{offline}: a valid CA externalgrpc cloud-config")
        for left_out in check.unchecked:
            print(f"  not checked: {left_out}")
    return 0 if ok else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from server import app, demo

    _configure_logging(args.log_format, args.log_level)
    running, sims = demo.start_demo(args.listen, args.http_listen, speed=args.speed)
    print(demo.banner(running, sims), flush=True)
    try:
        app.run_until_signalled(running)
    finally:
        for sim in sims.values():
            sim.stop()
    return 0


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ca-externalgrpc", description="cluster-autoscaler externalgrpc server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the CloudProvider gRPC API for the configured backends")
    serve.add_argument("--config", required=True, help="server YAML config file")
    serve.add_argument("--log-format", choices=["json", "text"], help="override log.format")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override log.level")
    serve.set_defaults(func=cmd_serve)

    validate = sub.add_parser("validate", help="check a server config and/or a CA cloud-config without serving")
    validate.add_argument("--config", help="server YAML config file")
    validate.add_argument("--cloud-config", help="the CA's externalgrpc --cloud-config file")
    validate.add_argument(
        "--offline",
        action="store_true",
        help="check the shape only: read no secret from the environment and no file the configs name; "
        "list what was left unchecked",
    )
    validate.set_defaults(func=cmd_validate)

    demo = sub.add_parser("demo", help="serve against the bundled Scaleway and Bizfly simulators (no credentials)")
    demo.add_argument("--listen", default="127.0.0.1:8086")
    demo.add_argument("--http-listen", default="127.0.0.1:8087")
    demo.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall-clock second")
    demo.add_argument("--log-format", choices=["json", "text"], default="text")
    demo.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    demo.set_defaults(func=cmd_demo)

    status = sub.add_parser("status", help="print node groups, sizes and instances of a running server")
    status.add_argument("--address", default="127.0.0.1:8086")
    status.add_argument("--cert", help="client certificate (mTLS)")
    status.add_argument("--key", help="client key (mTLS)")
    status.add_argument("--cacert", help="CA bundle that signed the server certificate")
    status.add_argument(
        "--server-name", help="name to expect in the server certificate (e.g. when connecting via port-forward)"
    )
    status.add_argument("--timeout", type=float, default=5.0)
    status.set_defaults(func=cmd_status)

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
