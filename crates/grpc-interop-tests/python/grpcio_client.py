"""The reference client: runs calls through a grpcio channel (gRPC C-core) with a service config.

Usage: grpcio_client.py ADDR CONFIG_JSON CALLS_JSON
CALLS_JSON is a list of {"call_id": str, "script": str, "timeout_s": float | null, and optionally
"request_id": str, sent as field 3 (AIP-155's idempotency key)}; the calls run
one after another on one channel (so they share its retry throttling). Prints a JSON list of
{"call_id", "code", "elapsed_ms"}.
"""
import json
import sys
import time

import grpc


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number, text):
    data = text.encode()
    return bytes([number << 3 | 2]) + varint(len(data)) + data


def main():
    addr, config, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    channel = grpc.insecure_channel(
        addr, options=[("grpc.service_config", config), ("grpc.enable_retries", 1)]
    )
    grpc.channel_ready_future(channel).result(timeout=10)
    method = channel.unary_unary("/interop.v1.Probe/Call")
    results = []
    for call in calls:
        request = field(1, call["call_id"]) + field(2, call["script"])
        if call.get("request_id"):
            request += field(3, call["request_id"])
        started = time.monotonic()
        try:
            method(request, timeout=call.get("timeout_s"))
            code = "OK"
        except grpc.RpcError as error:
            code = error.code().name
        results.append(
            {
                "call_id": call["call_id"],
                "code": code,
                "elapsed_ms": (time.monotonic() - started) * 1000.0,
            }
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
