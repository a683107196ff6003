#!/usr/bin/python3
"""Independent interop client for lmcache-go's ZMQ data path.

Written from the protocol description in the research notes
(research/datapath.md: framing 2.2, msgspec encoding 2.3, gen3 frozen ids
2.4/10.1, request table 4, engine-driven SHM path 7.2 and 10.2/10.4), not
from the Go implementation. It plays one vLLM scheduler and one vLLM worker
and needs only Debian packages: python3-zmq and python3-msgpack.

    /usr/bin/python3 mp_client.py --endpoint tcp://127.0.0.1:5555

Exit status 0 means every step matched; the last stdout line is a JSON
summary.
"""
import argparse
import json
import os
import random
import sys
from multiprocessing import resource_tracker, shared_memory

import msgpack
import zmq

# Gen-3 frozen legacy operation ids (research/datapath.md 2.4, 10.1).
GEN3 = {
    "store": 6, "retrieve": 7, "lookup": 8, "query_prefetch_status": 9,
    "free_lookup_locks": 12, "end_session": 13,
    "register_kv_cache_engine_driven_context": 14,
    "unregister_kv_cache_engine_driven_context": 15,
    "prepare_store": 16, "commit_store": 17, "prepare_retrieve": 18,
    "commit_retrieve": 19, "get_chunk_size": 21, "ping": 22, "noop": 24,
}
# Gen-2M mainline RequestType values (research/datapath.md 10.1); no
# wait_prefetch_status here.
GEN2M = {
    "store": 3, "retrieve": 4, "lookup": 5, "query_prefetch_status": 6,
    "free_lookup_locks": 8, "end_session": 9,
    "register_kv_cache_engine_driven_context": 10,
    "unregister_kv_cache_engine_driven_context": 11,
    "prepare_store": 12, "commit_store": 13, "prepare_retrieve": 14,
    "commit_retrieve": 15, "get_chunk_size": 17, "ping": 18, "noop": 20,
}
OPS = GEN3
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def pack(value):
    # msgspec-equivalent: dicts in declaration order, bytes as bin.
    return msgpack.packb(value, use_bin_type=True)


def unpack(frame):
    return msgpack.unpackb(frame, raw=False)


class Conn:
    """One DEALER socket, one request at a time."""

    def __init__(self, ctx, endpoint, timeout_ms):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.sock.connect(endpoint)
        self.uid = 0

    def call(self, op, *payloads, by_name=False):
        uid = pack(self.uid)
        self.uid += 1
        opf = pack(op if by_name or not isinstance(op, str) else OPS[op])
        self.sock.send_multipart([uid, opf] + [pack(p) for p in payloads])
        frames = self.sock.recv_multipart()
        if len(frames) != 3:
            raise AssertionError("%s: reply has %d frames" % (op, len(frames)))
        if frames[0] != uid or frames[1] != opf:
            raise AssertionError("%s: uid/op not echoed: %r" % (op, frames[:2]))
        return unpack(frames[2])


def ping_healthy(reply):
    # gen2m clients declare PING -> bool (always True); gen3 clients read an
    # int: the server's boot token (> 2) when healthy, 2 = "not registered,
    # register again".
    if OPS is GEN2M:
        return reply is True
    return isinstance(reply, int) and not isinstance(reply, bool) and reply > 2


def server_key(model, world, worker, tokens, start, end, request_id):
    # IPCCacheServerKey, newest field order (research/datapath.md 10.2).
    return {
        "model_name": model, "world_size": world, "worker_id": worker,
        "token_ids": list(tokens), "start": start, "end": end,
        "request_id": request_id, "cache_salt": "", "request_configs": None,
        "num_kv_readers": 1, "null_chunk_mask": None,
    }


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def lookup(sched, model, tokens, end, request_id, want, tries=2000):
    for _ in range(tries):
        expect(sched.call("lookup", server_key(model, 1, None, tokens, 0, end, request_id), 1) is None,
               "LOOKUP reply is not None")
        for _ in range(100000):
            n = sched.call("query_prefetch_status", request_id)
            if n is not None:
                break
        else:
            raise AssertionError("QUERY_PREFETCH_STATUS never ready for %s" % request_id)
        if n == want:
            return n
    raise AssertionError("lookup hit %s chunks, want %d" % (n, want))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--model", default="interop/model")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--timeout-ms", type=int, default=10000)
    ap.add_argument("--profile", choices=("gen3", "gen2m"), default="gen3")
    args = ap.parse_args()
    global OPS
    OPS = GEN3 if args.profile == "gen3" else GEN2M

    ctx = zmq.Context()
    sched = Conn(ctx, args.endpoint, args.timeout_ms)
    worker = Conn(ctx, args.endpoint, args.timeout_ms)
    summary = {}

    # Every adapter socket starts with GET_CHUNK_SIZE and no payload.
    chunk = sched.call("get_chunk_size")
    expect(isinstance(chunk, int) and chunk > 0, "chunk size %r" % (chunk,))
    expect(worker.call("get_chunk_size") == chunk, "worker chunk size")
    summary["chunk_size"] = chunk
    summary["profile"] = args.profile
    boot = sched.call("ping", None)
    expect(ping_healthy(boot), "PING %r" % (boot,))
    expect(sched.call("noop") == "OK", "NOOP")
    # Operation name sent as a string (newest clients).
    expect(sched.call("ping", None, by_name=True) == boot, "PING by name")

    instance_id = os.getpid()
    reg = worker.call("register_kv_cache_engine_driven_context", {
        "instance_id": instance_id, "model_name": args.model, "world_size": 1,
        "block_size": 16, "num_layers": args.layers, "hidden_dim_size": args.hidden,
        "dtype_str": "float16", "use_mla": False, "num_physical_slots": None,
        "engine_group_infos": [], "group_hidden_dim_sizes": None,
        "group_layout_descs": None, "enable_l1_kvweave_quant": False,
    })
    expect(isinstance(reg, dict) and reg.get("shm_name") and reg.get("pool_size", 0) > 0,
           "registration reply %r" % (reg,))
    summary["shm_name"] = reg["shm_name"]
    # Open the pool the way the LMCache SHM client does, and keep the
    # resource tracker from unlinking the server's segment at exit.
    shm = shared_memory.SharedMemory(name=reg["shm_name"].lstrip("/"), create=False)
    resource_tracker.unregister("/" + reg["shm_name"].lstrip("/"), "shared_memory")
    buf = shm.buf
    expect(len(buf) >= reg["pool_size"], "pool smaller than pool_size")

    rng = random.Random(1234)
    n = args.chunks
    tokens = [rng.randrange(0, 100000) for _ in range(n * chunk + 5)]
    end = n * chunk
    expect_shape = [2, args.layers, chunk, args.hidden]
    obj_bytes = 2 * args.layers * chunk * args.hidden * DTYPE_BYTES["float16"]

    expect(lookup(sched, args.model, tokens, end, "py-miss", 0, tries=1) == 0, "cold lookup")

    wkey = server_key(args.model, 1, 0, tokens, 0, end, "py-store")
    prep = worker.call("prepare_store", wkey, instance_id)
    ctxs = prep["context"]
    slots, idx = ctxs["slots"], ctxs["chunk_indices"]
    expect(len(slots) == n and sorted(idx) == list(range(n)), "PREPARE_STORE %r" % (ctxs,))
    payload = {}
    for slot, ci in zip(slots, idx):
        expect(set(slot) == {"offset", "length", "shape", "dtype"}, "slot keys %r" % (slot,))
        expect(slot["shape"] == expect_shape and slot["dtype"] == "float16" and slot["length"] == obj_bytes,
               "slot %r" % (slot,))
        off = slot["offset"]
        expect(off + slot["length"] <= reg["pool_size"], "slot outside the pool")
        data = bytes(rng.getrandbits(8) for _ in range(slot["length"]))
        buf[off:off + slot["length"]] = data
        payload[ci] = data
    expect(worker.call("commit_store", wkey, instance_id, b"") is True, "COMMIT_STORE")
    summary["stored_chunks"] = len(slots)

    hits = lookup(sched, args.model, tokens, end, "py-hit", n)
    summary["lookup_hits"] = hits

    rkey = server_key(args.model, 1, 0, tokens, 0, end, "py-hit")
    pr = worker.call("prepare_retrieve", rkey, instance_id)
    expect(pr["success"] is True and pr["data"] == b"", "PREPARE_RETRIEVE %r" % ({k: pr[k] for k in ("success",)},))
    rslots = pr["context"]["slots"]
    expect(len(rslots) == n, "retrieve slots %d" % len(rslots))
    for i, slot in enumerate(rslots):
        got = bytes(buf[slot["offset"]:slot["offset"] + slot["length"]])
        expect(got == payload[i], "chunk %d bytes differ" % i)
    expect(worker.call("commit_retrieve", rkey, instance_id) is True, "COMMIT_RETRIEVE")
    summary["verified_bytes"] = n * obj_bytes

    expect(sched.call("free_lookup_locks", server_key(args.model, 1, None, tokens, 0, end, "py-hit"), 1) is None,
           "FREE_LOOKUP_LOCKS")
    expect(sched.call("end_session", "py-hit") is None, "END_SESSION")
    # Unsupported GPU path: a negative reply of the declared type.
    expect(worker.call("store", wkey, instance_id, [[1]], b"") == [b"", False], "STORE refusal")
    # An unknown op gets no reply (never a value of a type the client did
    # not ask for): the next call's reply is the first frame back.
    sched.sock.send_multipart([pack(10**6), pack(999)])
    expect(sched.call("noop") == "OK", "NOOP after an unknown op")
    expect(ping_healthy(worker.call("ping", instance_id)), "worker PING")
    expect(worker.call("unregister_kv_cache_engine_driven_context", instance_id) is None, "UNREGISTER")
    after = worker.call("ping", instance_id)
    if OPS is GEN2M:
        expect(after is True, "gen2m PING after UNREGISTER %r" % (after,))
    else:
        expect(after == 2, "gen3 PING of an unregistered instance %r, want 2" % (after,))

    del buf
    shm.close()
    ctx.destroy(linger=0)
    summary["ok"] = True
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        sys.exit(1)
