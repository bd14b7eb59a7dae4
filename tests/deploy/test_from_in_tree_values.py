"""The Helm values ``ca-externalgrpc config from-in-tree`` prints for an in-tree install, rendered by the real
Helm CLI with the official chart: the pod they give the CA is the one deploy/helm's values files give it
(the same sidecar, volumes and mounts, the same externalgrpc flags and cloud-config), carrying the
converted server config."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from server.from_in_tree import CREDENTIALS_SECRET, convert, dump, migrated_values
from tests.deploy.chart import CHARTS, ChartSource, helm_template
from tests.deploy.test_helm_chart import MTLS, SIDECAR, ca_container, configmap_file, flags, mounted, pod, sidecar

ENV = {"CLUSTER_ID": str(uuid.UUID(int=2)), "SCW_SECRET_KEY": str(uuid.UUID(int=1)), "SCW_REGION": "fr-par"}
#: what an in-tree install's values hold that the switch touches (the chart needs autoDiscovery to render)
IN_TREE = {"cloudProvider": "scaleway", "envFromSecret": CREDENTIALS_SECRET, "autoDiscovery": {"clusterName": "c"}}


def _render(source: ChartSource, values: Path) -> tuple[dict[str, object], ...]:
    return helm_template(source, (values,), "1.34.0")


@pytest.mark.parametrize("source", CHARTS, ids=lambda s: s.label)
@pytest.mark.parametrize(("layout", "shipped"), [("sidecar", SIDECAR), ("service", MTLS)], ids=["sidecar", "service"])
def test_migrated_values_give_the_ca_the_pod_the_shipped_values_give(
    source: ChartSource, layout: str, shipped: Path, tmp_path: Path
) -> None:
    conversion = convert("scaleway", ENV, layout=layout)
    path = tmp_path / "values.yaml"
    path.write_text(dump(migrated_values(conversion, IN_TREE, CREDENTIALS_SECRET)))
    ours, theirs = _render(source, path), _render(source, shipped)

    our_ca, their_ca = ca_container(ours), ca_container(theirs)
    assert flags(our_ca)["cloud-provider"] == flags(their_ca)["cloud-provider"] == "externalgrpc"
    assert flags(our_ca)["cloud-config"] == flags(their_ca)["cloud-config"]
    assert not our_ca.get("envFrom"), "the CA keeps no cloud credentials"
    assert our_ca["volumeMounts"] == their_ca["volumeMounts"]
    assert pod(ours)["volumes"] == pod(theirs)["volumes"]
    strategies = [next(d for d in out if d["kind"] == "Deployment")["spec"]["strategy"] for out in (ours, theirs)]
    assert strategies[0] == strategies[1] == {"type": "Recreate"}  # one CA pod at a time
    if layout == "sidecar":
        assert sidecar(ours) == sidecar(theirs)
        volume = mounted(ours, our_ca, "/config")
        assert configmap_file(ours, volume, "cloud-config") == configmap_file(theirs, volume, "cloud-config")
        server = mounted(ours, sidecar(ours), "/etc/ca-externalgrpc")
        assert configmap_file(ours, server, "config.yaml") == conversion.config
    else:
        # The server and the CA's cloud-config come from deploy/kubernetes/server-mtls, not from the chart.
        assert not pod(ours).get("initContainers")
        template = next(d for d in ours if d["kind"] == "Deployment")["spec"]["template"]  # type: ignore[index]
        assert template["metadata"]["labels"]["ca-externalgrpc/client"] == "true"  # admitted by its NetworkPolicy
