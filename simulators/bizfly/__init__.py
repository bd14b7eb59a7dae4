"""A faithful simulator of the Bizfly Cloud Kubernetes Engine API (docs/bizfly.md, "The simulator")."""

from simulators.bizfly.api import (
    ROUTE_CATALOG,
    ROUTE_DELETE_NODE,
    ROUTE_GET_CLUSTER,
    ROUTE_GET_POOL,
    ROUTE_LIST_CLUSTERS,
    ROUTE_TOKEN,
    ROUTE_UPDATE_POOL,
)
from simulators.bizfly.auth import DEFAULT_APP_CREDENTIALS, DEFAULT_USERS
from simulators.bizfly.scenario import DEMO_CLUSTER_UID, ScenarioError, demo_scenario, load_scenario_file
from simulators.bizfly.simulator import BizflySimulator
from simulators.bizfly.state import (
    NODE_ID_LABEL,
    POOL_NAME_LABEL,
    PROVIDER_ID_PREFIX,
    REAL_VOCABULARY,
    UPSTREAM_VOCABULARY,
    StatusVocabulary,
    Timings,
)

__all__ = [
    "DEFAULT_APP_CREDENTIALS",
    "DEFAULT_USERS",
    "DEMO_CLUSTER_UID",
    "NODE_ID_LABEL",
    "POOL_NAME_LABEL",
    "PROVIDER_ID_PREFIX",
    "REAL_VOCABULARY",
    "ROUTE_CATALOG",
    "ROUTE_DELETE_NODE",
    "ROUTE_GET_CLUSTER",
    "ROUTE_GET_POOL",
    "ROUTE_LIST_CLUSTERS",
    "ROUTE_TOKEN",
    "ROUTE_UPDATE_POOL",
    "UPSTREAM_VOCABULARY",
    "BizflySimulator",
    "ScenarioError",
    "StatusVocabulary",
    "Timings",
    "demo_scenario",
    "load_scenario_file",
]
