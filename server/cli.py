"""The ``ca-externalgrpc`` command: serve, validate, config from-in-tree, status."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from providers.config_errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from server.app import RunningServer
    from server.config import ServerConfig


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that states each option's default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if action.option_strings and default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


class VersionAction(argparse.Action):
    """``--version``: the version, the commit, the engine and the library versions (server/build_info.py),
    worked out only when asked for (it may run git)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from server.build_info import report

        print(report(parser.prog))
        parser.exit()


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
    from server.cloud_config import check_cloud_config, listen_mismatch
    from server.config import validate_file

    if not args.config and not args.cloud_config:
        print("error: pass --config and/or --cloud-config", file=sys.stderr)
        return 2
    if args.online and not args.config:
        print("error: --online checks the backends of a --config", file=sys.stderr)
        return 2
    ok = True
    offline = " (offline: shape only)" if args.offline else ""
    served: tuple[tuple[str, int], bool] | None = None  # (listen, tls) of a valid --config
    if args.config:
        result = validate_file(args.config, offline=args.offline, shell=True)
        if result.config is not None:
            served = (result.config.listen, result.config.tls is not None)
        elif not result.problems and result.shape is not None:
            served = result.shape
        if result.problems:
            ok = False
            print_problems(args.config, result.problems)
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
        if args.online and result.config is not None:
            ok = check_online(result.config) and ok
    if args.cloud_config:
        check = check_cloud_config(Path(args.cloud_config), offline=args.offline)
        if served is not None:
            check.problems += [f"{problem} (in {args.config})" for problem in listen_mismatch(*served, check)]
        if check.problems:
            ok = False
            for problem in check.problems:
                print(f"{args.cloud_config}: INVALID: {problem}")
        else:
            print(f"{args.cloud_config}: OK{offline}: a valid CA externalgrpc cloud-config")
        for left_out in check.unchecked:
            print(f"  not checked: {left_out}")
    return 0 if ok else 1


def check_online(config: ServerConfig) -> bool:
    """``validate --online``: each backend's read-only checks against its cloud (server/online.py), printed per
    backend as OK or INVALID with one line per problem, then what was proved, the node groups, warnings and
    what a read-only check cannot prove. True when no backend has a problem."""
    from server.online import check_backends

    # The report says what the cloud answered; the providers' own log lines (Python's last-resort handler
    # prints warnings when nothing configured logging) would only repeat it on stderr.
    if not logging.getLogger().handlers:
        logging.getLogger().addHandler(logging.NullHandler())
    checks = check_backends(config)
    for check in checks:
        subject = f"{check.name} ({check.cloud}): online"
        run = check.run
        if run.problems:
            print_problems(subject, run.problems)
        else:
            print(f"{subject}: OK")
        for line in run.proven:
            print(f"  proved: {line}")
        for group in run.groups:
            print(f"  {group}")
        for line in run.warnings:
            print(f"  WARNING: {line}")
        for line in run.unchecked:
            print(f"  not checked: {line}")
    return all(check.run.ok for check in checks)


def print_problems(subject: str, problems: Sequence[ConfigProblem], file: TextIO | None = None) -> None:
    """``<subject>: INVALID: N problems`` then one line per problem with its key and fix (on stdout by default:
    the one in place when called, not when this was defined)."""
    file = file or sys.stdout
    count = len(problems)
    print(f"{subject}: INVALID: {count} problem{'s' if count > 1 else ''}", file=file)
    for mistake in problems:
        print(f"  - {mistake}", file=file)


def cmd_config_from_in_tree(args: argparse.Namespace) -> int:
    """The config on stdout (or in ``--output``), the rest of the result on stdout after it with
    ``--output`` and on stderr without (so ``> config.yaml`` holds the config alone); problems and
    warnings always on stderr, so a redirect never swallows them nor leaves them in the file."""
    import yaml

    from server import from_in_tree

    env: Mapping[str, str] = os.environ
    current: Mapping[str, Any] | None = None
    problems: list[ConfigProblem] = []
    if args.env_file:
        try:
            env = from_in_tree.read_env_file(Path(args.env_file))
        except ConfigError as err:
            problems += err.problems
    if args.helm_values:
        try:
            current = yaml.safe_load(Path(args.helm_values).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            reason = err.strerror if isinstance(err, OSError) else f"not valid YAML ({err})"
            problems.append(
                ConfigProblem("--helm-values", f"cannot read {args.helm_values}: {reason}", "pass your values file")
            )
        else:
            if not isinstance(current, Mapping):
                problems.append(ConfigProblem("--helm-values", "expected a YAML mapping", "pass your values file"))
    subject = f"in-tree {args.cloud_provider} settings"
    if problems:  # the inputs themselves: converting a half-read environment would report the wrong things
        print_problems(subject, problems, file=sys.stderr)
        return 1
    cloud_config = Path(args.cloud_config) if args.cloud_config else None
    conversion = from_in_tree.convert(args.cloud_provider, env, cloud_config, args.layout, env_file=args.env_file)
    result = from_in_tree.check(conversion)
    if result.problems:
        print_problems(subject, result.problems, file=sys.stderr)
        return 1
    secret, warnings = from_in_tree.choose_secret(args.secret, current, args.layout)
    for warning in warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    if current is None:
        current, label = from_in_tree.in_tree_values(conversion, secret), "values of the in-tree install"
    else:
        label = args.helm_values
    text = from_in_tree.config_yaml(conversion)
    advice = from_in_tree.guidance(conversion, args.cloud_config, current, label, secret)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as err:
            print(f"error: cannot write --output {args.output}: {err.strerror or err}", file=sys.stderr)
            return 1
        print(f"{args.output}: written; it passes ca-externalgrpc validate\n{advice}", end="")
    else:
        print(text, end="")
        print(advice, end="", file=sys.stderr)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ca-externalgrpc",
        description="cluster-autoscaler externalgrpc cloud-provider server",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="print the version, the commit it was built from, the serving engine and the versions of "
        "grpcio, protobuf and the native engine, and exit",
    )
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
    reach = validate.add_mutually_exclusive_group()
    reach.add_argument(
        "--offline",
        action="store_true",
        help="check the shape only: read no secret from the environment and no file the configs name; "
        "list what was left unchecked",
    )
    reach.add_argument(
        "--online",
        action="store_true",
        help="also check every backend against its cloud with read-only calls (never a write): the credentials, "
        "the cluster or project, the region and each endpoint the server calls; list the node groups with their "
        "bounds and any pool another autoscaler also scales; exit 1 on any problem",
    )
    validate.set_defaults(func=cmd_validate)

    config = sub.add_parser(
        "config", help="config tools: convert an in-tree provider's settings", formatter_class=DefaultsHelpFormatter
    )
    config_sub = config.add_subparsers(dest="config_command", required=True)
    from_in_tree = config_sub.add_parser(
        "from-in-tree",
        help="print the server config for a CA that runs the in-tree scaleway or bizflycloud provider, checked "
        "by validate, with the CA flag changes and the Helm values diff (docs/reference/in-tree-differences.md)",
        formatter_class=DefaultsHelpFormatter,
    )
    from_in_tree.add_argument(
        "--cloud-provider",
        required=True,
        choices=["scaleway", "bizflycloud"],
        help="the CA's --cloud-provider today",
    )
    from_in_tree.add_argument(
        "--cloud-config", help="the CA's --cloud-config file today (Scaleway: its JSON; Bizfly: only opened)"
    )
    from_in_tree.add_argument(
        "--env-file",
        help="the CA's cloud variables as KEY=VALUE lines (kubectl create secret --from-env-file format); "
        "without it they are read from this process's environment",
    )
    from_in_tree.add_argument(
        "--layout",
        choices=["sidecar", "service"],
        default="sidecar",
        help="sidecar: the server in the CA's pod on loopback; service: its own Deployment and Service with mTLS",
    )
    from_in_tree.add_argument(
        "--secret",
        help="the Kubernetes Secret that holds those variables, which the server reads (default: the "
        "envFromSecret of --helm-values, else ca-externalgrpc-credentials)",
    )
    from_in_tree.add_argument(
        "--helm-values", help="the in-tree install's Helm values file; the diff is made against it"
    )
    from_in_tree.add_argument(
        "--output",
        help="write the config there (the rest goes to stdout); without it the config goes to stdout "
        "and the rest to stderr. Problems and warnings always go to stderr",
    )
    from_in_tree.set_defaults(func=cmd_config_from_in_tree)

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
