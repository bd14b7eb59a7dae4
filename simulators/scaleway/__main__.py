"""Run the Scaleway simulator on its own: ``python -m simulators.scaleway --port 0 [--scenario FILE]``.

Prints one line, the base URL, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from simulators.common.clock import Clock, ManualClock, WallClock
from simulators.scaleway.scenarios import demo_scenario, load_scenario_file
from simulators.scaleway.simulator import ScalewaySimulator
from simulators.scaleway.state import ScenarioError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m simulators.scaleway", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    parser.add_argument("--scenario", help="YAML scenario file (default: the demo scenario)")
    parser.add_argument("--clock", choices=("manual", "wall"), default="wall", help="how simulated time moves")
    parser.add_argument("--speed", type=float, default=1.0, help="wall clock speed-up factor")
    parser.add_argument("--secret-key", help="expected X-Auth-Token (default: the scenario's, else sim-secret-key)")
    parser.add_argument("--region", default="fr-par", help="default region of clusters that do not name one")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        scenario = load_scenario_file(args.scenario) if args.scenario else demo_scenario()
        clock: Clock = ManualClock() if args.clock == "manual" else WallClock(speed=args.speed)
        secret_key = args.secret_key or scenario.get("secret_key") or "sim-secret-key"
        simulator = ScalewaySimulator(scenario, clock=clock, secret_key=secret_key, region=args.region, port=args.port)
    except (ScenarioError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    simulator.start()
    print(simulator.url, flush=True)
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        simulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
