"""Transport security and secret hygiene.

* With TLS and a client CA configured, plaintext clients, clients without a certificate and clients
  whose certificate comes from an unrelated CA are all refused; the CA's own client gets through.
* Plaintext gRPC on a non-loopback address is refused when the config is loaded, unless
  ``allow_plaintext_non_loopback: true``, which must then say loudly (a WARNING) what it allows.
* Secrets (cloud keys, passwords, tokens the cloud issues) never appear in logs, gRPC error details,
  /metrics, /readyz or ``validate``/``status`` output, even when the cloud echoes them back in its
  error bodies, auth fails, and faults hit every route.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from devstack.certs import Pki, make_pki
from devstack.harness import InProcessServer, ServerProcess
from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc
from providers.config_errors import ConfigError
from server import config as server_config
from simulators.common.faults import Fault as _Fault
from tests.reliability.clouds import BIZFLY_EMAIL, BizflyKit, ScalewayKit
from tests.reliability.harness import PoolSpec, server_raw_config

POOLS = (PoolSpec("sec-a", 0, 5, 1), PoolSpec("sec-b", 1, 4, 2))
SCW_SECRET = "scw-sk-5e2b9c41-7d3f-4a8e-b6c0-91f2d4e8a7c3"
BIZFLY_PASSWORD = "bz-pw-Tq8Lm2Zr6xYv-fa91c0"


# ---------------------------------------------------------------------------------------------- TLS
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def bizfly_sim() -> Iterator[object]:
    sim = BizflyKit().make_sim(POOLS, BIZFLY_PASSWORD)
    sim.start()
    yield sim
    sim.stop()


def _tls_server(sim: object, pki: Pki, mutual: bool) -> InProcessServer:
    kit = BizflyKit()
    tls = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
    if mutual:
        tls["client_ca"] = str(pki.ca_cert)
    raw = server_raw_config([kit.backend_entry(sim, BIZFLY_PASSWORD)], extra={"tls": tls})
    return InProcessServer(raw, env=kit.env(BIZFLY_PASSWORD))


def _answers(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(), timeout=3)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()
    finally:
        channel.close()


def _secure(port: int, pki: Pki, cert: Path | None = None, key: Path | None = None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    return grpc.secure_channel(f"127.0.0.1:{port}", creds)


def test_mtls_refuses_plaintext_certless_and_foreign_clients(bizfly_sim: object, pki: Pki) -> None:
    running = _tls_server(bizfly_sim, pki, mutual=True)
    try:
        port = running.port
        assert _answers(grpc.insecure_channel(f"127.0.0.1:{port}")) == grpc.StatusCode.UNAVAILABLE
        assert _answers(_secure(port, pki)) == grpc.StatusCode.UNAVAILABLE
        foreign = _secure(port, pki, pki.other_client_cert, pki.other_client_key)
        assert _answers(foreign) == grpc.StatusCode.UNAVAILABLE
        # The positive control: the CA's own certificate works on the same server.
        assert _answers(_secure(port, pki, pki.client_cert, pki.client_key)) == grpc.StatusCode.OK
    finally:
        running.stop(grace=0)


def test_tls_without_client_ca_still_refuses_plaintext(bizfly_sim: object, pki: Pki) -> None:
    running = _tls_server(bizfly_sim, pki, mutual=False)
    try:
        assert _answers(grpc.insecure_channel(f"127.0.0.1:{running.port}")) == grpc.StatusCode.UNAVAILABLE
        assert _answers(_secure(running.port, pki)) == grpc.StatusCode.OK
    finally:
        running.stop(grace=0)


# ---------------------------------------------------------------------------------------------- plaintext policy
def _raw_with_listen(listen: str, **extra: object) -> dict[str, object]:
    sim_entry = {
        "name": "scw",
        "type": "scaleway",
        "scaleway": {"cluster_id": "c1", "region": "fr-par", "api_url": "https://api.scaleway.com"},
    }
    return {"listen": listen, "http_listen": None, "backends": [sim_entry], **extra}


@pytest.mark.parametrize("listen", ["0.0.0.0:8086", "10.1.2.3:8086", "[::]:8086", "my-host.example:8086"])
def test_plaintext_on_non_loopback_is_refused_at_config_load(listen: str) -> None:
    with pytest.raises(ConfigError) as caught:
        server_config.parse(_raw_with_listen(listen), env={"SCW_SECRET_KEY": SCW_SECRET})
    assert caught.value.key == "listen"
    assert "allow_plaintext_non_loopback" in str(caught.value)


@pytest.mark.parametrize("listen", ["127.0.0.1:8086", "[::1]:8086", "localhost:8086"])
def test_plaintext_on_loopback_is_accepted_silently(listen: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        server_config.parse(_raw_with_listen(listen), env={"SCW_SECRET_KEY": SCW_SECRET})
    assert not [r for r in caplog.records if "plaintext" in r.getMessage().lower()]


def test_plaintext_on_non_loopback_when_allowed_loads_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    raw = _raw_with_listen("0.0.0.0:8086", allow_plaintext_non_loopback=True)
    with caplog.at_level(logging.WARNING):
        config = server_config.parse(raw, env={"SCW_SECRET_KEY": SCW_SECRET})
    assert config.allow_plaintext_non_loopback is True
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "plaintext" in r.getMessage().lower()]
    assert warnings, "allowing plaintext gRPC on a non-loopback address must log a WARNING saying so"
    assert "0.0.0.0" in warnings[0].getMessage()


# ---------------------------------------------------------------------------------------------- secrets
def test_secrets_never_appear_in_logs_errors_metrics_or_cli_output(tmp_path: Path) -> None:
    scw_kit, bz_kit = ScalewayKit(), BizflyKit()
    scw = scw_kit.make_sim(POOLS, SCW_SECRET).start()
    bz = bz_kit.make_sim(POOLS, BIZFLY_PASSWORD).start()
    fast_sync = {"interval": "1s", "min_interval": "0.2s", "max_staleness": "2s"}
    backends = [
        {**scw_kit.backend_entry(scw, SCW_SECRET), "sync": fast_sync},
        {**bz_kit.backend_entry(bz, BIZFLY_PASSWORD), "sync": fast_sync},
    ]
    raw = server_raw_config(backends)
    raw["log"] = {"format": "json", "level": "debug"}
    env = {**scw_kit.env(SCW_SECRET), **bz_kit.env(BIZFLY_PASSWORD)}
    server = ServerProcess(raw, env, tmp_path, log_level="debug")
    seen: list[str] = []  # every gRPC error detail, /metrics, probe bodies and CLI outputs
    try:
        stub = server.stub

        def call(method: str, request: object, timeout: float = 5.0) -> None:
            try:
                getattr(stub, method)(request, timeout=timeout)
            except grpc.RpcError as err:
                seen.append(f"{method} {err.code().name}: {err.details()}")

        groups = [g.id for g in stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups]
        assert len(groups) == 4
        scw_group = next(iter(scw_kit.pools(scw)))
        bz_group = next(iter(bz_kit.pools(bz)))
        scw_echo = f"invalid X-Auth-Token {SCW_SECRET}"
        bz_echo = f"wrong password {BIZFLY_PASSWORD} for {BIZFLY_EMAIL}"
        # The cloud refuses the key and echoes it back, on writes and on the sync's reads.
        for status in (401, 403, 500, 503, 400):
            scw.faults.add(_fault("update_pool", status, scw_echo))
            call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=scw_group, delta=1))
            bz.faults.add(_fault("update_pool", status, bz_echo))
            call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=bz_group, delta=1))
        # A proxy in front of one cloud that echoes every credential it has seen, the other cloud's too.
        echo = f"{scw_echo} {bz_echo}"
        scw.faults.add(_fault("update_pool", 502, echo))
        call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=scw_group, delta=1))
        bz.faults.add(_fault("update_pool", 502, echo))
        call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=bz_group, delta=1))
        # Token expiry and a token endpoint that refuses the password (echoing it).
        bz.expire_tokens()
        bz.faults.add(_fault("token", 401, bz_echo, times=3))
        call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=bz_group, delta=1))
        # A late answer, a dropped connection, then sync reads failing long enough to go stale.
        scw.faults.add(_Fault(route="update_pool", delay=1.5, times=1))
        call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=scw_group, delta=1), timeout=1.0)
        bz.faults.add(_Fault(route="update_pool", drop=True, times=1))
        call("NodeGroupIncreaseSize", pb.NodeGroupIncreaseSizeRequest(id=bz_group, delta=1))
        for route in scw_kit.read_routes:
            scw.faults.add(_fault(route, 401, scw_echo, times=None))
        for route in bz_kit.read_routes:
            bz.faults.add(_fault(route, 403, bz_echo, times=None))
        time.sleep(3.0)  # several failed background syncs, snapshot beyond max_staleness
        call("Refresh", pb.RefreshRequest())
        for gid in groups:
            call("NodeGroupTargetSize", pb.NodeGroupTargetSizeRequest(id=gid))
            call("NodeGroupDeleteNodes", pb.NodeGroupDeleteNodesRequest(id=gid, nodes=[pb.ExternalGrpcNode()]))
        seen.append(server.http_get("/metrics")[1])
        seen.append(server.http_get("/readyz")[1])
        seen.append(server.http_get("/healthz")[1])
        seen.append(server.cli("validate", "--config", str(server.config_path)))
        seen.append(server.cli("status", "--address", f"127.0.0.1:{server.grpc_port}"))
        assert any("UNAVAILABLE" in s or "FAILED_PRECONDITION" in s for s in seen), "the faults did not bite"
    finally:
        server.stop()
        scw.stop()
        bz.stop()
    seen.append(_validate_misplaced_secrets(server, tmp_path))
    tokens = {r.headers.get("x-auth-token", "") for r in bz.requests.all()} - {""}
    assert tokens, "the Bizfly simulator never saw a token"
    secrets = {"scaleway secret key": SCW_SECRET, "bizfly password": BIZFLY_PASSWORD}
    secrets.update({f"bizfly token {i}": t for i, t in enumerate(sorted(tokens))})
    places = {"server log": server.output, **{f"output {i}": text for i, text in enumerate(seen)}}
    leaks = [
        (what, where, text[max(text.find(value) - 200, 0) : text.find(value) + 60])
        for what, value in secrets.items()
        for where, text in places.items()
        if value in text
    ]
    assert not leaks, f"secrets leaked: {leaks}"


def _validate_misplaced_secrets(server: ServerProcess, workdir: Path) -> str:
    """Configs with a secret in the wrong place: the error names the key, never echoes the value."""
    out = []
    bad = workdir / "bad.yaml"
    bad.write_text(
        "backends:\n"
        "  - name: scw\n    type: scaleway\n"
        f"    scaleway: {{cluster_id: c1, region: fr-par, secret_key_env: '{SCW_SECRET}'}}\n"
    )
    out.append(server.cli("validate", "--config", str(bad)))
    bad.write_text(
        "backends:\n"
        "  - name: bz\n    type: bizfly\n"
        f"    bizfly: {{email: a@b.c, passwd: '{BIZFLY_PASSWORD}', cluster_name: k1}}\n"
    )
    out.append(server.cli("validate", "--config", str(bad)))
    assert all("INVALID" in text for text in out), out
    return "\n".join(out)


def _fault(route: str, status: int, message: str, times: int | None = 1) -> _Fault:
    return _Fault(route=route, status=status, message=message, times=times)
