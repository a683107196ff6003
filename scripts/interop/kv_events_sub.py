#!/usr/bin/python3
"""Independent KV-events subscriber for lmcache-go's native publisher.

Written from vLLM's published KV-events wire contract (a ZMQ PUB stream of
(topic, 8-byte big-endian sequence, msgpack KVEventBatch) messages and a
replay ROUTER that answers [b"", start sequence] with (sequence, payload)
messages and an end marker of sequence -1), not from the Go implementation.
It plays a KV-aware router and needs only Debian packages: python3-zmq and
python3-msgpack.

    /usr/bin/python3 kv_events_sub.py --endpoint tcp://127.0.0.1:5557 \
        --replay tcp://127.0.0.1:5558 [--topic kv] [--drop 50:150]

It prints SUBSCRIBED once connected, then reads "EXPECT <n>" from stdin: it
exits 0 after n events, printing one JSON line with every event in
sequence order. Batches it missed (the subscription started late, or
--drop A:B discarded sequences [A, B) on purpose) are fetched from the
replay socket. Any protocol violation exits 1 with the reason on stderr.
"""
import argparse
import json
import sys
import threading
import time

import msgpack
import zmq


def fail(msg):
    print("kv_events_sub: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, dict) or set(batch) != {"ts", "events", "data_parallel_rank"}:
        fail("batch is not a KVEventBatch map: %r" % (batch,))
    if not isinstance(batch["ts"], float):
        fail("ts is not a float: %r" % (batch["ts"],))
    out = []
    for ev in batch["events"]:
        kind = ev.get("type")
        if kind == "BlockStored":
            want = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium", "lora_name"}
            if set(ev) != want:
                fail("BlockStored fields %r" % sorted(ev))
            if len(ev["token_ids"]) != ev["block_size"] * len(ev["block_hashes"]):
                fail("BlockStored with %d tokens for %d blocks of %d" % (
                    len(ev["token_ids"]), len(ev["block_hashes"]), ev["block_size"]))
            out.append([kind, ev["block_hashes"], ev["parent_block_hash"], len(ev["token_ids"]), ev["medium"]])
        elif kind == "BlockRemoved":
            if set(ev) != {"type", "block_hashes", "medium"}:
                fail("BlockRemoved fields %r" % sorted(ev))
            out.append([kind, ev["block_hashes"], None, 0, ev["medium"]])
        elif kind == "AllBlocksCleared":
            fail("AllBlocksCleared published: a clear must be announced as removals")
        else:
            fail("unknown event %r" % (ev,))
    for h in (h for e in out for h in e[1]):
        if not (isinstance(h, int) and 0 <= h < 2 ** 64):
            fail("block hash %r is not a 64-bit unsigned int" % (h,))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--drop", default="", help="A:B: discard live sequences [A, B) once")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    drop_lo, drop_hi = (int(x) for x in args.drop.split(":")) if args.drop else (0, 0)

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    sub.connect(args.endpoint)
    # A DEALER, not vLLM's example REQ: a REQ socket cannot receive the
    # several messages one replay request answers with.
    replay = ctx.socket(zmq.DEALER)
    replay.setsockopt(zmq.LINGER, 0)
    replay.setsockopt(zmq.RCVTIMEO, 10000)
    replay.connect(args.replay)

    expect = []
    def read_stdin():
        for line in sys.stdin:
            if line.startswith("EXPECT "):
                expect.append(int(line.split()[1]))
    threading.Thread(target=read_stdin, daemon=True).start()
    print("SUBSCRIBED", flush=True)

    events, next_seq = [], 0
    stats = {"replayed": 0, "dropped": 0, "replay_requests": 0, "duplicates": 0}

    def accept(seq, payload):
        nonlocal next_seq
        if seq < next_seq:
            stats["duplicates"] += 1
            return
        if seq != next_seq:
            fail("accept out of order: %d, want %d" % (seq, next_seq))
        for ev in decode_batch(payload):
            events.append([seq] + ev)
        next_seq = seq + 1

    def fill_from_replay(upto):
        # Ask for everything from next_seq; keep what is below upto (or all
        # of it when upto is None), in order.
        stats["replay_requests"] += 1
        replay.send_multipart([b"", next_seq.to_bytes(8, "big")])
        while True:
            try:
                frames = replay.recv_multipart()
            except zmq.Again:
                fail("replay from %d: no end marker within 10 s" % next_seq)
            if len(frames) != 3 or frames[0] != b"":
                fail("replay frames %r" % (frames,))
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                if frames[2] != b"":
                    fail("end marker with a payload")
                return
            if upto is None or seq < upto:
                if seq == next_seq:
                    stats["replayed"] += 1
                accept(seq, frames[2])

    deadline = time.monotonic() + args.timeout
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while not (expect and len(events) >= expect[0]):
        if time.monotonic() > deadline:
            fail("timed out with %d events (expected %s), next sequence %d, stats %r" % (
                len(events), expect[0] if expect else "?", next_seq, stats))
        if not poller.poll(200):
            if expect and len(events) < expect[0]:
                fill_from_replay(None)  # the tail was missed: nothing later will show the gap
            continue
        topic, seq_b, payload = sub.recv_multipart()
        if topic != args.topic.encode():
            fail("topic %r" % topic)
        seq = int.from_bytes(seq_b, "big")
        if drop_lo <= seq < drop_hi:
            stats["dropped"] += 1
            continue
        if seq > next_seq:
            fill_from_replay(seq)
            if seq != next_seq:
                fail("replay left a gap: have up to %d, live %d" % (next_seq - 1, seq))
        accept(seq, payload)
    if len(events) != expect[0]:
        fail("%d events, expected %d" % (len(events), expect[0]))
    print(json.dumps({"events": events, "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
