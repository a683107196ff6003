"""A stand-in for upstream LMCache's Kafka cache-event sink and source.

Runs on Debian's python3-confluent-kafka (librdkafka), the client upstream
uses, with the client settings upstream's KafkaCacheEventSink and
KafkaCacheEventSource pass (read from its source; the code is ours).

  upstream_client.py produce BOOTSTRAP TOPIC   < JSON lines {"key": str, "batch": {...}}
      one record per batch, value {"batches":[batch]} as compact JSON,
      key the instance id; prints one JSON line per delivery report.
  upstream_client.py consume BOOTSTRAP TOPIC GROUP N
      reads N records, printing {"key","partition","offset","value"} per record,
      storing each offset after it is printed; close() commits.
"""
import json
import sys
import time

from confluent_kafka import Consumer, Producer


def produce(bootstrap, topic):
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "client.id": "lmcache-cache-events",
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": 30000,
        "queue.buffering.max.kbytes": 64 * 1024,
    })
    failures = []

    def report(err, msg):
        if err is not None:
            failures.append(str(err))
            return
        print(json.dumps({"key": msg.key().decode(), "partition": msg.partition(), "offset": msg.offset()}), flush=True)

    for line in sys.stdin:
        if not line.strip():
            continue
        item = json.loads(line)
        value = json.dumps({"batches": [item["batch"]]}, separators=(",", ":"))
        producer.produce(topic=topic, key=item["key"].encode(), value=value.encode(), on_delivery=report)
        producer.poll(0)
    left = producer.flush(30)
    if left or failures:
        sys.exit(f"{left} records undelivered, failures: {failures}")


def consume(bootstrap, topic, group, n):
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": "lmcache-coordinator",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
    })
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    got = 0
    while got < n:
        if time.monotonic() > deadline:
            sys.exit(f"consumed {got} of {n} records before the deadline")
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error() is not None:
            print(f"consumer error: {msg.error()}", file=sys.stderr)
            continue
        print(json.dumps({"key": msg.key().decode(), "partition": msg.partition(),
                          "offset": msg.offset(), "value": msg.value().decode()}), flush=True)
        consumer.store_offsets(message=msg)
        got += 1
    consumer.close()


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "consume":
        consume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
