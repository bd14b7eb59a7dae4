"""A faithful simulator of the Scaleway Kapsule private autoscaler API (docs/reference/scaleway.md, "The simulator")."""

from simulators.scaleway.scenarios import demo_public_cluster, demo_scenario, generated_cluster, load_scenario_file
from simulators.scaleway.simulator import ScalewaySimulator
from simulators.scaleway.state import Behaviour, ScenarioError, Timings

__all__ = [
    "Behaviour",
    "ScalewaySimulator",
    "ScenarioError",
    "Timings",
    "demo_public_cluster",
    "demo_scenario",
    "generated_cluster",
    "load_scenario_file",
]
