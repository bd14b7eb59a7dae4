"""A faithful simulator of the Bizfly Cloud Kubernetes Engine API (docs/reference/bizfly.md, "The simulator")."""

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
    DEFAULT_PROJECT_ID,
    NODE_ID_LABEL,
    POOL_NAME_LABEL,
    PROVIDER_ID_PREFIX,
    PROVISIONING_VOCABULARY,
    SENLIN_VOCABULARY,
    UPSTREAM_VOCABULARY,
    ApiShapes,
    StatusVocabulary,
    Timings,
)

__all__ = [
    "DEFAULT_APP_CREDENTIALS",
    "DEFAULT_PROJECT_ID",
    "DEFAULT_USERS",
    "DEMO_CLUSTER_UID",
    "NODE_ID_LABEL",
    "POOL_NAME_LABEL",
    "PROVIDER_ID_PREFIX",
    "PROVISIONING_VOCABULARY",
    "ROUTE_CATALOG",
    "ROUTE_DELETE_NODE",
    "ROUTE_GET_CLUSTER",
    "ROUTE_GET_POOL",
    "ROUTE_LIST_CLUSTERS",
    "ROUTE_TOKEN",
    "ROUTE_UPDATE_POOL",
    "SENLIN_VOCABULARY",
    "UPSTREAM_VOCABULARY",
    "ApiShapes",
    "BizflySimulator",
    "ScenarioError",
    "StatusVocabulary",
    "Timings",
    "demo_scenario",
    "load_scenario_file",
]
