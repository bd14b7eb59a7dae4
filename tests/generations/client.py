"""A CloudProvider client compiled from one generation's schema, run in its own process.

Usage: python -m tests.generations.client old|new ADDRESS < calls.json
``calls.json`` is a list of {"rpc": name, "request": <JSON form of the request>}; prints a JSON list of
{"response": <JSON form>} or {"code": "NOT_FOUND", "details": "..."} in the same order. A separate
process is needed because both schemas define the same proto package.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
from pathlib import Path

import grpc
from google.protobuf import json_format

ROOT = Path(__file__).resolve().parents[2]


def load(generation: str):  # type: ignore[no-untyped-def]
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix=f"gen-{generation}-"))
    schema_dir = Path(__file__).resolve().parent / generation
    wkt = Path(protoc.__file__).resolve().parent / "_proto"
    name = f"ca_{generation}.proto"
    files = [name] + (["protos/k8s_core_v1.proto"] if generation == "old" else [])
    code = protoc.main(
        [
            "protoc",
            f"-I{schema_dir}",
            f"-I{ROOT}",
            f"-I{wkt}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *files,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed for {generation}")
    (out / "protos").mkdir(exist_ok=True)
    sys.path.insert(0, str(out))
    module = importlib.import_module(f"ca_{generation}_pb2")
    stubs = importlib.import_module(f"ca_{generation}_pb2_grpc")
    return module, stubs


def main() -> int:
    generation, address = sys.argv[1], sys.argv[2]
    pb, pb_grpc = load(generation)
    calls = json.load(sys.stdin)
    service = pb.DESCRIPTOR.services_by_name["CloudProvider"]
    results = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)
        for call in calls:
            method = service.methods_by_name[call["rpc"]]
            request_cls = getattr(pb, method.input_type.name)
            request = json_format.ParseDict(call.get("request", {}), request_cls())
            try:
                response = getattr(stub, call["rpc"])(request, timeout=call.get("timeout", 5))
            except grpc.RpcError as err:
                results.append({"code": err.code().name, "details": err.details()})
                continue
            results.append(
                {
                    "response": json_format.MessageToDict(response, preserving_proto_field_name=True),
                    "bytes": response.SerializeToString().hex(),
                }
            )
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
