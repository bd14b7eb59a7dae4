"""A gRPC client of the mTLS layout's Service, run inside the real node's network namespace: what the
fail-over scenario (tests/e2e/test_node_service.py) measures with.

    python -m tests.e2e.service_prober --target dns://DNS/NAME:PORT --certs DIR

It connects as the CA does: one long-lived channel to the Service's DNS name (resolved by the cluster
DNS the target names, a ClusterIP that kube-proxy sends to a Ready endpoint), with the client
certificate, key and CA of the layout's Secret ``ca-externalgrpc-client-tls`` (``tls.crt``, ``tls.key``,
``ca.crt`` in DIR), grpcio's default reconnection backoff. Commands come on stdin, one JSON object a line;
each answer is one JSON line on stdout:

- ``{"cmd": "read"}``: one NodeGroups call; ``{"ok": ..., "code": ..., "detail": ..., "groups": [...]}``
- ``{"cmd": "write", "group": ID, "interval": S, "timeout": S, "deadline": S}``: NodeGroupIncreaseSize by
  one every ``interval`` seconds (each call with the CA's ``deadline``) until one is accepted or
  ``timeout`` passes; ``{"accepted": time or null, "attempts": [{"at", "code", "detail"}, ...]}``.

Bounded: a write loop stops at its first accepted call (one machine) or its timeout; the process ends
when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from protos import externalgrpc_pb2 as pb
from protos import externalgrpc_pb2_grpc as pb_grpc


def _call(method: Any, request: Any, deadline: float) -> tuple[str, str, Any]:
    try:
        return "OK", "", method(request, timeout=deadline)
    except grpc.RpcError as err:
        return err.code().name, (err.details() or "")[:200], None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target", required=True)
    parser.add_argument("--certs", type=Path, required=True)
    args = parser.parse_args(argv)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(args.certs / "ca.crt").read_bytes(),
        private_key=(args.certs / "tls.key").read_bytes(),
        certificate_chain=(args.certs / "tls.crt").read_bytes(),
    )
    channel = grpc.secure_channel(args.target, credentials)
    stub = pb_grpc.CloudProviderStub(channel)
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "read":
            code, detail, answer = _call(stub.NodeGroups, pb.NodeGroupsRequest(), 5.0)
            groups = [g.id for g in answer.nodeGroups] if answer is not None else []
            print(json.dumps({"ok": code == "OK", "code": code, "detail": detail, "groups": groups}), flush=True)
        elif command["cmd"] == "write":
            attempts: list[dict[str, Any]] = []
            accepted = None
            request = pb.NodeGroupIncreaseSizeRequest(id=command["group"], delta=1)
            give_up = time.monotonic() + float(command["timeout"])
            while time.monotonic() < give_up:
                started = time.time()
                code, detail, _ = _call(stub.NodeGroupIncreaseSize, request, float(command["deadline"]))
                attempts.append({"at": started, "code": code, "detail": detail})
                if code == "OK":
                    accepted = started
                    break
                time.sleep(max(0.0, float(command["interval"]) - (time.time() - started)))
            print(json.dumps({"accepted": accepted, "attempts": attempts}), flush=True)
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
