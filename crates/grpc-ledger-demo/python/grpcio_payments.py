"""A foreign client of the payments service: Python's grpcio (gRPC C-core), keys in the body.

Usage: grpcio_payments.py ADDR CONFIG_JSON RUN_ID PAYMENTS ROUNDS
Sends PAYMENTS CreatePayment calls, one after another on one channel, each with its AIP-155
`request_id` (field 4) as its only idempotency key (no idempotency metadata), retried by C-core as
CONFIG_JSON says. A payment not acknowledged is sent again, same bytes, in a later round (at most
ROUNDS rounds). Prints a JSON list of {"account", "code", "payment_id", "posting_id", "rounds"}.
The messages are encoded and decoded by hand, so no generated code is needed.
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


def text_field(number, text):
    data = text.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


def int_field(number, value):
    return varint(number << 3 | 0) + varint(value)


def read_varint(data, at):
    shift, value = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def text_fields(data):
    """The length-delimited fields of a message, by number (other wire types skipped)."""
    fields, at = {}, 0
    while at < len(data):
        key, at = read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = read_varint(data, at)
        elif wire == 2:
            length, at = read_varint(data, at)
            fields[number] = data[at : at + length].decode()
            at += length
        else:
            raise ValueError("unexpected wire type %d" % wire)
    return fields


def main():
    addr, config, run_id = sys.argv[1], sys.argv[2], sys.argv[3]
    payments, rounds = int(sys.argv[4]), int(sys.argv[5])
    channel = grpc.insecure_channel(
        addr, options=[("grpc.service_config", config), ("grpc.enable_retries", 1)]
    )
    grpc.channel_ready_future(channel).result(timeout=10)
    create = channel.unary_unary("/payments.v1.Payments/CreatePayment")
    metadata = [("authorization", "Bearer demo-client-token")]
    results = {}
    for n in range(payments):
        account = "acct-%s-%d" % (run_id, n)
        results[n] = {"account": account, "code": None, "rounds": 0}
    for _ in range(rounds):
        pending = [n for n, r in results.items() if r["code"] != "OK"]
        if not pending:
            break
        for n in pending:
            request = (
                text_field(1, results[n]["account"])
                + int_field(2, 100 + n)
                + text_field(4, "%s-request-%d" % (run_id, n))
            )
            results[n]["rounds"] += 1
            try:
                answer = create(request, timeout=5.0, metadata=metadata)
                payment = text_fields(answer)
                results[n].update(
                    code="OK", payment_id=payment.get(1, ""), posting_id=payment.get(4, "")
                )
            except grpc.RpcError as error:
                results[n]["code"] = error.code().name
        time.sleep(0.2)
    print(json.dumps([results[n] for n in range(payments)]))


if __name__ == "__main__":
    main()
