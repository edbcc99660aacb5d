"""Builds one logical CreateOrderRequest with Python's protobuf runtime (the library grpcio
clients use), from the descriptor set given as argv[1], once per insertion order of its maps,
and prints each serialization as hex, one per line.

The Rust test fingerprints every line and the same request built in Rust: all must be equal.
"""
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, any_pb2

with open(sys.argv[1], "rb") as f:
    files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
pool = descriptor_pool.DescriptorPool()
for file in files.file:
    pool.Add(file)
CreateOrderRequest = message_factory.GetMessageClass(
    pool.FindMessageTypeByName("orders.v1.CreateOrderRequest"))
Line = message_factory.GetMessageClass(pool.FindMessageTypeByName("orders.v1.Line"))

LABELS = [(f"label-{i}", f"value-{i}") for i in range(8)]
ATTRIBUTES = [("colour", "red"), ("size", "L"), ("fit", "slim")]


def build(order):
    request = CreateOrderRequest()
    request.account = "acct-1"
    request.amount_minor = 500
    for k, v in order(LABELS):
        request.labels[k] = v
    line = request.lines.add()
    line.sku = "sku-1"
    line.quantity = 2
    for k, v in order(ATTRIBUTES):
        line.attributes[k] = v
    for line_id in order([7, 9]):
        shipped = request.shipping.by_id[line_id]
        shipped.sku = f"sku-{line_id}"
        for k, v in order(ATTRIBUTES):
            shipped.attributes[k] = v
    request.coupons.extend([3, 1, 2])
    packed = Line()
    packed.sku = "in-any"
    for k, v in order(ATTRIBUTES):
        packed.attributes[k] = v
    request.extension.Pack(packed)
    return request.SerializeToString()


orders = [
    lambda items: list(items),
    lambda items: list(reversed(items)),
    lambda items: list(items)[1::2] + list(items)[0::2],
]
for order in orders:
    print(build(order).hex())
