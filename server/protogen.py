"""Generate (or check) the Python protobuf code kept beside the .proto files in ``protos/``.

``make protos`` writes ``protos/*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py``; ``make protos-check``
(and a unit test) fails when those files differ from what the pinned grpcio-tools would produce, so
hand edits and stale generated code are caught.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PROTO_FILES = ("externalgrpc.proto", "k8s_core_v1.proto", "diagnostics.proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc into ``out_root`` (which mirrors the repository root) and return the files written."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    wkt = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{wkt}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(Path("protos") / name) for name in PROTO_FILES],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_root / "protos").glob("*_pb2*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate protos/*_pb2*.py")
    mode.add_argument("--check", action="store_true", help="fail if the generated code is stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale: list[str] = []
        for path in fresh:
            target = PROTO_DIR / path.name
            if args.write:
                shutil.copyfile(path, target)
            elif not target.exists() or not filecmp.cmp(path, target, shallow=False):
                stale.append(target.name)
        existing = {p.name for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
        orphans = sorted(existing - {p.name for p in fresh})
        if args.check and (stale or orphans):
            print(f"generated protobuf code is stale: {stale + orphans}; run `make protos`", file=sys.stderr)
            return 1
    print("protos: generated code is current" if args.check else "protos: regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
