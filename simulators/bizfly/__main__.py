"""Run the Bizfly simulator standalone: ``python -m simulators.bizfly --port 0``.

Prints the base URL on the first line of stdout, then serves until SIGTERM or SIGINT. Without
``--scenario`` it serves ``demo_scenario()``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from simulators.bizfly.scenario import ScenarioError, demo_scenario, load_scenario_file
from simulators.bizfly.simulator import BizflySimulator
from simulators.common.clock import Clock, ManualClock, WallClock


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m simulators.bizfly", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = pick a free one)")
    parser.add_argument("--scenario", help="YAML scenario file (default: the built-in demo scenario)")
    parser.add_argument("--clock", choices=("manual", "wall"), default="wall", help="what drives transitions")
    parser.add_argument("--speed", type=float, default=1.0, help="wall clock speed-up factor")
    parser.add_argument("--region", default=None, help="region spelling in the service catalog (default HN)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        scenario = load_scenario_file(args.scenario) if args.scenario else demo_scenario()
        clock: Clock = ManualClock() if args.clock == "manual" else WallClock(args.speed)
        simulator = BizflySimulator(scenario, clock=clock, port=args.port, region_spelling=args.region)
    except (OSError, ScenarioError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    simulator.start()
    print(simulator.url, flush=True)
    try:
        stopping.wait()
    finally:
        simulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
