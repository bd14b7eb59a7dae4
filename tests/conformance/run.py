"""``make conformance``: drive our server with the upstream CA's own externalgrpc client and with grpcurl.

For every CA version module (``ca1341``, ``ca1361``) it builds the Go driver (``go build``; the Go
build and module caches make a warm run quick), then for each transport (plaintext, mTLS) starts a
fresh lab (both simulators + the server, see ``lab.py``), writes the expectations and the CA
cloud-config, and runs the driver. Then it builds the real grpcurl and runs ``list``, ``describe``
and every read-only RPC through server reflection, plaintext and with mTLS (plus one refused
handshake with a certificate from an unrelated CA). It prints a summary with the number of checks
per client and exits non-zero on any failure or on anything it could not run.

Run as ``python -m tests.conformance.run [--only 1.34.1|1.36.1|grpcurl ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.certs import Pki, make_pki
from tests.conformance.lab import Endpoint, Lab

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Where the built binaries go; the Makefile passes its GO_CACHE_DIR. Go's own build and module
# caches (GOCACHE, GOMODCACHE) stay at their default locations so every Go build on the machine
# shares them.
DEFAULT_BIN_DIR = Path(os.environ.get("GO_CACHE_DIR", Path.home() / ".cache" / "ca-externalgrpc-go")) / "bin"
GO_BUILD_TIMEOUT_SECONDS = 1800  # a cold build of the CA packages compiles k8s.io/kubernetes
CA_RUN_TIMEOUT_SECONDS = 300
GRPCURL_TIMEOUT_SECONDS = 30

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
RPCS = (
    "NodeGroups",
    "NodeGroupForNode",
    "PricingNodePrice",
    "PricingPodPrice",
    "GPULabel",
    "GetAvailableGPUTypes",
    "Cleanup",
    "Refresh",
    "NodeGroupTargetSize",
    "NodeGroupIncreaseSize",
    "NodeGroupDeleteNodes",
    "NodeGroupDecreaseTargetSize",
    "NodeGroupNodes",
    "NodeGroupTemplateNodeInfo",
    "NodeGroupGetOptions",
)


@dataclass(frozen=True)
class CaModule:
    version: str
    directory: Path

    @property
    def binary_name(self) -> str:
        return self.directory.name


CA_MODULES = (CaModule("1.34.1", HERE / "ca1341"), CaModule("1.36.1", HERE / "ca1361"))
GRPCURL_MODULE = HERE / "grpcurl"


class ConformanceError(Exception):
    """Something the suite needs could not be prepared; the message says what and how to fix it."""


class GoToolchainMissing(ConformanceError):
    pass


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


# --------------------------------------------------------------------------------------------- Go
# Where the official tarball and Debian put go when it is installed but not on PATH (e.g. make
# run from an IDE with a minimal environment).
GO_FALLBACK_PATHS = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")


def go_binary() -> str:
    found = shutil.which("go") or next((p for p in GO_FALLBACK_PATHS if Path(p).exists()), None)
    if found is None:
        raise GoToolchainMissing(
            "the conformance suite needs the Go toolchain (go >= 1.25) to build the upstream cluster-autoscaler "
            "client and grpcurl, and `go` is not on PATH; install Go (see the README) and run again"
        )
    return found


def go_build(module_dir: Path, package: str, output: Path) -> Path:
    if not (module_dir / "go.mod").exists():
        raise ConformanceError(f"{module_dir.relative_to(REPO)} has no go.mod: this client module is not set up")
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = [go_binary(), "build", "-o", str(output), package]
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=module_dir, capture_output=True, text=True, timeout=GO_BUILD_TIMEOUT_SECONDS, check=False
    )
    if proc.returncode != 0:
        raise ConformanceError(f"`go build` in {module_dir.relative_to(REPO)} failed:\n{proc.stderr.strip()[-4000:]}")
    print(f"built {output.name} in {time.monotonic() - started:.1f}s", flush=True)
    return output


# ----------------------------------------------------------------------------------------- CA runs
def run_ca(binary: Path, module: CaModule, label: str, pki: Pki | None, workdir: Path) -> ClientResult:
    name = f"CA {module.version} {label}"
    result = ClientResult(name)
    rundir = workdir / f"{module.binary_name}-{label}"
    rundir.mkdir()
    with Lab(rundir, pki) as lab:
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
    result.name = f"{name} (k8s.io/autoscaler/cluster-autoscaler {data['ca_module']})"
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
def run(selected: Sequence[str], bin_dir: Path) -> list[ClientResult]:
    results: list[ClientResult] = []
    with tempfile.TemporaryDirectory(prefix="ca-conformance-") as tmp:
        workdir = Path(tmp)
        pki = make_pki(workdir / "pki")
        transports = (("plaintext", None), ("mtls", pki))
        for module in CA_MODULES:
            if selected and module.version not in selected:
                continue
            try:
                binary = go_build(module.directory, ".", bin_dir / module.binary_name)
            except ConformanceError as err:
                results.append(ClientResult(f"CA {module.version}", error=str(err)))
                continue
            for label, tls in transports:
                results.append(run_ca(binary, module, label, tls, workdir))
        if not selected or "grpcurl" in selected:
            try:
                binary = go_build(GRPCURL_MODULE, "github.com/fullstorydev/grpcurl/cmd/grpcurl", bin_dir / "grpcurl")
            except ConformanceError as err:
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
        runs = [r for r in results if r.name.startswith(f"CA {module.version}")]
        done = [r for r in runs if r.error is None]
        if not done:
            if runs:
                print(f"  CA {module.version}: NOT RUN")
            continue
        counted = " + ".join(f"{r.passed + r.failed}" for r in done)
        print(f"  CA {module.version}: {sum(r.passed + r.failed for r in done)} checks ({counted} over transports)")
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
        choices=[m.version for m in CA_MODULES] + ["grpcurl"],
        help="run only these clients (repeatable); default: every CA version and grpcurl",
    )
    parser.add_argument("--bin-dir", type=Path, default=DEFAULT_BIN_DIR, help="where built binaries are kept")
    args = parser.parse_args(argv)
    try:
        go_binary()
    except GoToolchainMissing as err:
        print(f"conformance: {err}", file=sys.stderr)
        return 2
    started = time.monotonic()
    results = run(args.only, args.bin_dir)
    ok = print_summary(results)
    print(f"conformance run took {time.monotonic() - started:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
