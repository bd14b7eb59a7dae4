"""``make conformance``: drive our server with the upstream CA's own externalgrpc client and with grpcurl.

For every CA client generation (``ca1341``: the <=1.34.1 generation, ``ca1361``: CA 1.36.1,
``cahead``: CA HEAD) it takes the Go driver that ``make build`` compiled (``tests/support/gobuild``;
nothing is compiled here), then for each transport (plaintext, mTLS) starts a fresh lab (both
simulators + the server, see ``lab.py``), writes the expectations and the CA cloud-config, and runs
the driver. Then it runs the real grpcurl: ``list``, ``describe`` and every read-only RPC through
server reflection, plaintext and with mTLS (plus one refused handshake with a certificate from an
unrelated CA). It prints a summary naming each CA version and the commit it was built from, with
the number of checks per client, and exits non-zero on any failure or on anything it could not run.

Run as ``python -m tests.conformance.run [--only 1.34.1|1.36.1|head|grpcurl ...]`` after ``make build``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.certs import Pki, make_pki
from protos import externalgrpc_pb2 as pb
from tests.conformance.lab import Endpoint, InstalledServer, Lab
from tests.support import gobuild

CA_RUN_TIMEOUT_SECONDS = 300
GRPCURL_TIMEOUT_SECONDS = 30

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
# Every RPC of the service, as our proto (wire-identical to the CA's) declares them.
RPCS = tuple(pb.DESCRIPTOR.services_by_name["CloudProvider"].methods_by_name)


@dataclass(frozen=True)
class CaModule:
    """One client generation: the key ``--only`` takes, the binary its build.toml declares, its name."""

    key: str
    binary_name: str
    title: str
    # What the pinned CA module's version/version.go must declare, when it declares a release.
    declares: str | None = None


CA_MODULES = (
    # Pinned at a master commit carrying the 1.33.0-1.34.1 client (see ca1341/go.mod).
    CaModule("1.34.1", "ca-client-1.34.1", "1.34.1-generation"),
    CaModule("1.36.1", "ca-client-1.36.1", "1.36.1", declares="1.36.1"),
    CaModule("head", "ca-client-head", "HEAD"),
)
GRPCURL_BINARY = "grpcurl"


def commit_of(pseudo_version: str) -> str:
    """The commit a Go pseudo-version (``v0.0.0-<time>-<12 hex>``) was cut from; "" for a release tag."""
    tail = pseudo_version.rsplit("-", 1)[-1]
    return tail if len(tail) == 12 and all(c in "0123456789abcdef" for c in tail) else ""


def describe_module(path: str, version: str) -> str:
    commit = commit_of(version)
    return f"{path} {version}" + (f", commit {commit}" if commit else "")


@dataclass
class ClientResult:
    """Checks of one client run (one CA version over one transport, or grpcurl over one transport)."""

    name: str
    passed: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    error: str | None = None  # set when the run could not produce check results at all

    @property
    def ok(self) -> bool:
        return self.error is None and self.failed == 0 and self.passed > 0


# ----------------------------------------------------------------------------------------- CA runs
def run_ca(
    binary: Path,
    module: CaModule,
    label: str,
    pki: Pki | None,
    workdir: Path,
    installed: InstalledServer | None = None,
) -> ClientResult:
    """One CA client run against a fresh lab: this checkout's server in-process, or ``installed``."""
    name = f"CA {module.title} {label}"
    result = ClientResult(name)
    rundir = workdir / f"{module.binary_name}-{label}"
    rundir.mkdir()
    with Lab(rundir, pki, installed) as lab:
        expectations = rundir / "expectations.json"
        expectations.write_text(json.dumps(lab.expectations(mutate=True), indent=2))
        cloud_config = lab.write_cloud_config(rundir / "cloud-config.yaml")
        cmd = [str(binary), "-expectations", str(expectations), "-cloud-config", str(cloud_config), "-label", label]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CA_RUN_TIMEOUT_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            result.error = f"the CA driver did not finish within {CA_RUN_TIMEOUT_SECONDS}s"
            return result
    for line in proc.stdout.splitlines():
        if line.startswith(("PASS ", "FAIL ")):
            print(f"  {line}")
    summary = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("SUMMARY ")), None)
    if summary is None:
        tail = (proc.stderr or proc.stdout).strip()[-3000:]
        result.error = f"the CA driver exited with {proc.returncode} and no summary:\n{tail}"
        return result
    data = json.loads(summary.removeprefix("SUMMARY "))
    result.passed, result.failed, result.failures = data["passed"], data["failed"], data["failures"] or []
    built = describe_module("k8s.io/autoscaler/cluster-autoscaler", data["ca_module"])
    if data.get("core_module"):
        built += "; core " + describe_module(*data["core_module"].split(" ", 1))
    result.name = f"{name} ({built})"
    declared = data.get("declared_version", "")
    if module.declares is not None and declared != module.declares:
        result.error = (
            f"{module.binary_name} is linked against a CA module that declares version {declared!r}, not "
            f"{module.declares}: its go.mod pins the wrong commit"
        )
    return result


# ---------------------------------------------------------------------------------------- grpcurl
class GrpcurlChecks:
    """The real grpcurl against one lab: reflection listing, description and the read-only RPCs."""

    def __init__(self, binary: Path, endpoint: Endpoint, result: ClientResult) -> None:
        self.binary = binary
        self.endpoint = endpoint
        self.result = result

    def _transport_args(self, client_cert: Path | None = None, client_key: Path | None = None) -> list[str]:
        pki = self.endpoint.pki
        if pki is None:
            return ["-plaintext"]
        return [
            "-cacert",
            str(pki.ca_cert),
            "-cert",
            str(client_cert or pki.client_cert),
            "-key",
            str(client_key or pki.client_key),
        ]

    def grpcurl(
        self, *args: str, data: dict[str, Any] | None = None, transport: list[str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), *(transport if transport is not None else self._transport_args())]
        if data is not None:
            cmd += ["-d", json.dumps(data)]
        cmd += [self.endpoint.address, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=GRPCURL_TIMEOUT_SECONDS, check=False)

    def check(self, name: str, ok: bool, detail: str) -> None:
        full = f"grpcurl/{self.result.name.split()[-1]}/{name}"
        print(f"  {'PASS' if ok else 'FAIL'} {full} {detail}")
        if ok:
            self.result.passed += 1
        else:
            self.result.failed += 1
            self.result.failures.append(full)

    def call(self, rpc: str, data: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        proc = self.grpcurl(f"{SERVICE}/{rpc}", data=data)
        if proc.returncode != 0:
            return None, proc.stderr.strip()
        return json.loads(proc.stdout or "{}"), ""

    def run(self, expectations: dict[str, Any]) -> None:
        listing = self.grpcurl("list")
        services = set(listing.stdout.split())
        self.check(
            "list",
            listing.returncode == 0 and SERVICE in services and "grpc.health.v1.Health" in services,
            f"services {sorted(services)}" if listing.returncode == 0 else listing.stderr.strip(),
        )
        described = self.grpcurl("describe", SERVICE)
        missing = [rpc for rpc in RPCS if f"rpc {rpc} (" not in described.stdout]
        self.check(
            "describe",
            described.returncode == 0 and not missing,
            f"{len(RPCS) - len(missing)}/{len(RPCS)} rpcs" + (f", missing {missing}" if missing else ""),
        )
        self._read_only_rpcs(expectations)
        if self.endpoint.pki is not None:
            pki = self.endpoint.pki
            refused = self.grpcurl("list", transport=self._transport_args(pki.other_client_cert, pki.other_client_key))
            self.check(
                "mtls-foreign-client-refused",
                refused.returncode != 0,
                "handshake refused" if refused.returncode != 0 else "a client of an unrelated CA was served",
            )
            plain = self.grpcurl("list", transport=["-plaintext"])
            self.check(
                "mtls-plaintext-refused",
                plain.returncode != 0,
                "plaintext refused" if plain.returncode != 0 else "plaintext was served on the mTLS port",
            )

    def _read_only_rpcs(self, expectations: dict[str, Any]) -> None:
        backends = expectations["backends"]
        groups = [g for b in backends for g in b["groups"]]
        want_ids = sorted(g["id"] for g in groups)
        body, err = self.call("NodeGroups", {})
        got_ids = sorted(g.get("id", "") for g in (body or {}).get("nodeGroups", []))
        self.check("NodeGroups", body is not None and got_ids == want_ids, err or f"{len(got_ids)} groups")

        with_node = next(g for g in groups if g.get("managed_node"))
        node = with_node["managed_node"]
        body, err = self.call(
            "NodeGroupForNode",
            {"node": {"providerID": node["provider_id"], "name": node["name"], "labels": node["labels"]}},
        )
        got = ((body or {}).get("nodeGroup") or {}).get("id")
        self.check("NodeGroupForNode", got == with_node["id"], err or f"-> {got}")

        body, err = self.call("NodeGroupTargetSize", {"id": with_node["id"]})
        got_size = int((body or {}).get("targetSize", 0))
        self.check(
            "NodeGroupTargetSize", body is not None and got_size == with_node["target_size"], err or str(got_size)
        )

        body, err = self.call("NodeGroupNodes", {"id": with_node["id"]})
        got_nodes = sorted(i.get("id", "") for i in (body or {}).get("instances", []))
        want_nodes = sorted(i["id"] for i in with_node["instances"])
        self.check(
            "NodeGroupNodes",
            body is not None and set(want_nodes) <= set(got_nodes),
            err or f"{len(got_nodes)} instances",
        )

        templated = next(g for g in groups if g.get("template"))
        body, err = self.call("NodeGroupTemplateNodeInfo", {"id": templated["id"]})
        raw = (body or {}).get("nodeBytes") or ""
        self.check(
            "NodeGroupTemplateNodeInfo",
            body is not None and bool(raw) and (body or {}).get("nodeInfo") == raw,
            err or f"{len(str(raw))} base64 chars in both generations' fields",
        )

        configured = next((g for g in groups if g.get("options")), None)
        if configured is not None:
            body, err = self.call("NodeGroupGetOptions", {"id": configured["id"], "defaults": {}})
            opts = (body or {}).get("nodeGroupAutoscalingOptions") or {}
            want = configured["options"]["scale_down_utilization_threshold"]
            self.check(
                "NodeGroupGetOptions",
                body is not None and abs(float(opts.get("scaleDownUtilizationThreshold", -1)) - want) < 1e-9,
                err or f"scaleDownUtilizationThreshold={opts.get('scaleDownUtilizationThreshold')}",
            )

        body, err = self.call("GPULabel", {})
        got_label = (body or {}).get("label", "")
        self.check("GPULabel", got_label == expectations["gpu_label"], err or repr(got_label))

        body, err = self.call("GetAvailableGPUTypes", {})
        got_types = sorted(((body or {}).get("gpuTypes") or {}).keys())
        self.check("GetAvailableGPUTypes", got_types == expectations["gpu_types"], err or str(got_types))

        # Pricing over one hour, in the new-generation timestamp fields (the server reads both).
        hour = {"startTimestamp": "2026-01-01T00:00:00Z", "endTimestamp": "2026-01-01T01:00:00Z"}
        priced = next((g for g in groups if g.get("managed_node") and g.get("node_price") is not None), None)
        if priced is not None:
            pnode = priced["managed_node"]
            body, err = self.call(
                "PricingNodePrice",
                {
                    "node": {"providerID": pnode["provider_id"], "name": pnode["name"], "labels": pnode["labels"]},
                    **hour,
                },
            )
            price = float((body or {}).get("price", 0.0))
            self.check(
                "PricingNodePrice",
                body is not None and abs(price - priced["node_price"]) < 1e-9,
                err or f"{price} for one hour (want {priced['node_price']})",
            )
        # A pod price of a number or UNIMPLEMENTED are both valid answers; any other error is not.
        proc = self.grpcurl(f"{SERVICE}/PricingPodPrice", data=hour)
        ok = proc.returncode == 0 or "Code: Unimplemented" in proc.stderr
        self.check("PricingPodPrice", ok, proc.stdout.strip().replace("\n", " ") or proc.stderr.strip().splitlines()[0])


def run_grpcurl(binary: Path, label: str, pki: Pki | None, workdir: Path) -> ClientResult:
    result = ClientResult(f"grpcurl {label}")
    rundir = workdir / f"grpcurl-{label}"
    rundir.mkdir()
    with Lab(rundir, pki) as lab:
        GrpcurlChecks(binary, lab.endpoint, result).run(lab.expectations(mutate=False))
    return result


# ------------------------------------------------------------------------------------------- main
def run(selected: Sequence[str]) -> list[ClientResult]:
    """Run the selected clients (every one when empty) with the binaries ``make build`` produced."""
    results: list[ClientResult] = []
    with tempfile.TemporaryDirectory(prefix="ca-conformance-") as tmp:
        workdir = Path(tmp)
        pki = make_pki(workdir / "pki")
        transports = (("plaintext", None), ("mtls", pki))
        for module in CA_MODULES:
            if selected and module.key not in selected:
                continue
            try:
                binary = gobuild.binary_path(module.binary_name)
            except gobuild.GoBuildError as err:
                results.append(ClientResult(f"CA {module.title}", error=str(err)))
                continue
            for label, tls in transports:
                results.append(run_ca(binary, module, label, tls, workdir))
        if not selected or "grpcurl" in selected:
            try:
                binary = gobuild.binary_path(GRPCURL_BINARY)
            except gobuild.GoBuildError as err:
                results.append(ClientResult("grpcurl", error=str(err)))
            else:
                for label, tls in transports:
                    results.append(run_grpcurl(binary, label, tls, workdir))
    return results


def print_summary(results: Sequence[ClientResult]) -> bool:
    print("\nconformance summary")
    for r in results:
        if r.error is not None:
            print(f"  ERROR {r.name}: {r.error}")
            continue
        mark = "ok  " if r.ok else "FAIL"
        print(f"  {mark} {r.name}: {r.passed} checks passed, {r.failed} failed")
        for failure in r.failures:
            print(f"         - {failure}")
    for module in CA_MODULES:
        runs = [r for r in results if r.name.startswith(f"CA {module.title} ") or r.name == f"CA {module.title}"]
        done = [r for r in runs if r.error is None]
        if not done:
            if runs:
                print(f"  CA {module.title}: NOT RUN")
            continue
        counted = " + ".join(f"{r.passed + r.failed}" for r in done)
        print(f"  CA {module.title}: {sum(r.passed + r.failed for r in done)} checks ({counted} over transports)")
    passed = sum(r.passed for r in results)
    failed = sum(r.failed for r in results) + sum(1 for r in results if r.error is not None)
    print(f"conformance: {passed} passed, {failed} failed")
    return bool(results) and all(r.ok for r in results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=[m.key for m in CA_MODULES] + ["grpcurl"],
        help="run only these clients (repeatable); default: every CA client generation and grpcurl",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = run(args.only)
    ok = print_summary(results)
    print(f"conformance run took {time.monotonic() - started:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
