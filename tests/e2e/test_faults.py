"""The real CA 1.36.1 through our server when things go wrong: a failed creation, our server restarted
in the middle of a scale-up, one cloud's API down for many loops."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from devstack.harness import REPO_ROOT, child_env, serve_command, server_config
from simulators.common import Fault
from tests.e2e.environment import (
    E2EEnvironment,
    Layout,
    OurServer,
    StartEnvironment,
    measure,
    scaleway_pool,
)
from tests.e2e.pools import APP_CPU, FILLER_CPU, POOL_LABEL, SCALE_UP, machines, pool_size
from tests.e2e.report import publish, record_timing
from tests.e2e.scenarios import FAILURES, failed_creation_backs_the_group_off

# Each scenario starts its own cluster (about 15 s) and waits for real loops: more than the default 120 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


@pytest.mark.parametrize(("cloud", "mode"), FAILURES, ids=[f"{c}-{m}" for c, m in FAILURES])
def test_failed_creation_backs_the_group_off_and_scales_another_that_fits(
    start_environment: StartEnvironment, cloud: str, mode: str
) -> None:
    title = f"failed creation ({cloud} {mode}) -> other group"
    failed_creation_backs_the_group_off(start_environment, cloud, mode, title)


def test_server_restarted_during_a_scale_up_makes_no_duplicate_and_the_ca_recovers(
    start_environment: StartEnvironment,
) -> None:
    cloud = "scaleway"

    def fill(env: E2EEnvironment) -> None:
        (only,) = machines(env, cloud, "general")
        env.create_pod("filler", cpu=FILLER_CPU[cloud], node_name=only["name"])
        env.wait_pod_running("filler", 30)

    env = start_environment(SCALE_UP, prepare=fill)
    group = env.group_id(cloud, "general")
    created = env.create_pod("app", cpu=APP_CPU[cloud], node_selector={POOL_LABEL[cloud]: "general"})
    # Kill our server (no drain) as soon as it has accepted the scale-up, while the machine is still booting.
    env.wait_for(lambda: env.ours.rpc_log("NodeGroupIncreaseSize"), 60, "the CA's IncreaseSize")
    env.ours.kill()
    killed = time.time()
    assert machines(env, cloud, "general")[-1]["id"]  # the new machine exists, still booting
    time.sleep(4)  # two CA loops against a dead address
    env.ours.start_again()
    restarted = time.time()

    pod = env.wait_pod_running("app", 120)
    record_timing(measure(env, "server restarted during scale-up (scaleway)", "app", created, cloud))
    assert len(env.cloud_requests(cloud, "update_pool")) == 1, "a second resize: duplicate machine requested"
    assert pool_size(env, cloud, "general") == 2
    assert len(machines(env, cloud, "general")) == 2
    assert pod.spec.node_name in {m["name"] for m in machines(env, cloud, "general")}
    assert env.ours.target(group) == 2
    # The CA saw the outage (failed calls), then loops succeeded again with no further provider error.
    assert env.ca.log.provider_errors(since=killed)
    env.ca.wait_for_loops(3, since=restarted + 3, timeout=30)
    assert not env.ca.log.provider_errors(since=restarted + 3), env.ca.log.provider_errors(since=restarted + 3)
    assert env.ca.last_successful_loop() > restarted
    env.check_running()


def test_one_cloud_down_for_many_loops_the_other_keeps_autoscaling(start_environment: StartEnvironment) -> None:
    def fill(env: E2EEnvironment) -> None:
        (only,) = machines(env, "scaleway", "general")
        env.create_pod("filler", cpu=FILLER_CPU["scaleway"], node_name=only["name"])
        env.wait_pod_running("filler", 30)

    env = start_environment(SCALE_UP, prepare=fill)
    # Every Bizfly API route (token included) answers 503 until cleared.
    env.bz.faults.add(Fault(route="*", status=503, message="service unavailable"))
    down = time.time()
    created = env.create_pod("app", cpu=APP_CPU["scaleway"], node_selector={POOL_LABEL["scaleway"]: "general"})
    pod = env.wait_pod_running("app", 120)
    record_timing(measure(env, "scale-up while the other cloud is down (scaleway)", "app", created, "scaleway"))
    assert pod.spec.node_name in {m["name"] for m in machines(env, "scaleway", "general")}
    assert pool_size(env, "scaleway", "general") == 2
    # Keep Bizfly down for at least 30 s (15 loops), then check the loops kept completing.
    time.sleep(max(0.0, down + 30 - time.time()))
    loops = env.ca.log.loops(since=down)
    assert len(loops) >= 10, f"only {len(loops)} CA loops in 30 s of Bizfly outage"
    assert env.ca.last_successful_loop() > time.time() - 10, "CA loops stopped completing during the outage"
    assert env.bz.requests.filter(), "our server never tried Bizfly during the outage"

    env.bz.faults.clear()
    up = time.time()
    # No waiting for the circuit breaker's next probe: the scale-up asked right away is itself sent as
    # the probe (a failed one would make the CA back the group off for 5 minutes).
    (bz_only,) = machines(env, "bizfly", "general")
    env.create_pod("bz-filler", cpu=FILLER_CPU["bizfly"], node_name=bz_only["name"])
    created = env.create_pod("bz-app", cpu=APP_CPU["bizfly"], node_selector={POOL_LABEL["bizfly"]: "general"})
    env.wait_pod_running("bz-app", 120)
    record_timing(measure(env, "scale-up after the cloud came back (bizfly)", "bz-app", created, "bizfly"))
    assert pool_size(env, "bizfly", "general") == 2
    env.ca.wait_for_loops(3, since=time.time(), timeout=30)
    late = env.ca.log.provider_errors(since=up + 10)
    assert not late, late


WRONG_KEY = "00000000-0000-4000-8000-000000000000"
ONE_CLOUD = Layout(scaleway_pools=[scaleway_pool("general", "DEV1-M", 1, 1, 3)], bizfly_pools=[])


def test_a_wrong_secret_key_is_named_in_the_cas_own_log(start_environment: StartEnvironment) -> None:
    """A first install with a wrong SCW_SECRET_KEY: the real CA's log names the backend, the cloud's 401 and
    the setting to check within its first loop, and ``status`` says the same and exits 3."""

    def serve(env: E2EEnvironment, backends: list[dict[str, Any]]) -> OurServer:
        (scaleway,) = [b for b in backends if b["type"] == "scaleway"]
        scaleway["scaleway"].pop("secret_key")
        scaleway["scaleway"]["secret_key_env"] = "SCW_SECRET_KEY"  # as the shipped overlays name it
        return OurServer(server_config([scaleway]), env.workdir, env={"SCW_SECRET_KEY": WRONG_KEY})

    env = start_environment(ONE_CLOUD, serve=serve)
    started = time.time()
    line = env.wait_for(
        lambda: env.ca.log.matching(r"Failed to refresh cloud provider config", since=started - 60),
        60,
        "the CA's log line for the failed Refresh",
    )[0]
    text = line.text()
    publish(f"the CA's own log line with a wrong secret key:\n{json.dumps(dict(line.fields))}")
    assert "code = Unavailable" in text
    assert "no backend can serve node groups: backend 'scw' has never synced: the cloud refused the credentials" in text
    assert "answered 401" in text
    assert "check the key in environment variable SCW_SECRET_KEY" in text
    assert WRONG_KEY not in env.ca.log.path.read_text()
    # Within one loop: the first loop that ran after the server was up logged it.
    loops = env.ca.log.loops()
    assert loops and line.at <= loops[0].at + 15, (line.at, loops[0].at)
    status = subprocess.run(
        [*serve_command(), "status", "--address", env.ours.address],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env=child_env(),
    )  # fmt: skip
    publish(f"ca-externalgrpc status with a wrong secret key (exit {status.returncode}):\n{status.stdout}")
    assert status.returncode == 3
    assert "backend scw (scaleway): UNHEALTHY, not synced, 0 group(s), snapshot age -" in status.stdout
    assert "  check: the key in environment variable SCW_SECRET_KEY" in status.stdout
    # Nothing was scaled and nothing was written to the cloud.
    assert env.cloud_requests("scaleway", "update_pool") == []
