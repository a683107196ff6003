#!/usr/bin/python3
"""Regenerate the golden msgpack frames in testdata/golden/.

Run with Debian's interpreter (python3-msgpack): /usr/bin/python3 gen_golden.py
Python dicts keep insertion order, so each dict below lists the fields in the
declaration order of the LMCache dataclass / msgspec Struct it stands for;
msgspec encodes those as maps keyed by field name, all fields present,
tuples as arrays, bytes as bin and ints in their smallest form, which is what
msgpack.packb(use_bin_type=True) produces for these values.
"""
import os
import msgpack

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def key8():
    return {"model_name": "m", "world_size": 1, "worker_id": None,
            "token_ids": (1, 2, 3), "start": 0, "end": 0,
            "request_id": "r", "cache_salt": ""}


def key11(worker_id=None, tokens=(1, 2, 3), start=0, end=0):
    return {"model_name": "m", "world_size": 1, "worker_id": worker_id,
            "token_ids": tokens, "start": start, "end": end,
            "request_id": "r", "cache_salt": "", "request_configs": None,
            "num_kv_readers": 1, "null_chunk_mask": None}


FRAMES = {
    # Frames 0 and 1 of a request.
    "uid_0": 0,
    "uid_70000": 70000,
    "op_get_chunk_size_gen2m": 17,
    "op_get_chunk_size_gen3": 21,
    "op_name_lookup": "lookup",
    # Scalars in msgspec's smallest forms.
    "int_127": 127,
    "int_128": 128,
    "int_255": 255,
    "int_256": 256,
    "int_65536": 65536,
    "int_2p32": 1 << 32,
    "int_max63": (1 << 63) - 1,
    "int_neg1": -1,
    "int_neg33": -33,
    "int_neg129": -129,
    "uint_2p63": 1 << 63,
    "uint_max64": (1 << 64) - 1,
    "nil": None,
    "true": True,
    "false": False,
    "str_ok": "OK",
    "empty_list": [],
    # Keys.
    "key_8_fields": key8(),
    "key_11_fields": key11(),
    "key_worker_big_tokens": key11(worker_id=1, tokens=(0, 127, 128, 255, 256, 65535, 65536, 4294967295), start=0, end=8),
    # Payloads.
    "register_payload": {
        "instance_id": 4242, "model_name": "meta-llama/Llama-3.1-8B", "world_size": 2,
        "block_size": 16, "num_layers": 32, "hidden_dim_size": 1024,
        "dtype_str": "float16", "use_mla": False, "num_physical_slots": None,
        "engine_group_infos": [], "group_hidden_dim_sizes": None,
        "group_layout_descs": None, "enable_l1_kvweave_quant": False},
    "register_payload_hybrid": {
        "instance_id": 7, "model_name": "m", "world_size": 1,
        "block_size": 16, "num_layers": 4, "hidden_dim_size": 64,
        "dtype_str": "bfloat16", "use_mla": False, "num_physical_slots": None,
        "engine_group_infos": [{"engine_group_id": 0, "layer_indices": [0, 1]},
                               {"engine_group_id": 1, "layer_indices": [2, 3]}],
        "group_hidden_dim_sizes": None, "group_layout_descs": None,
        "enable_l1_kvweave_quant": False},
    "register_payload_8_fields": {
        "instance_id": 1, "model_name": "m", "world_size": 1, "block_size": 16,
        "num_layers": 2, "hidden_dim_size": 8, "dtype_str": "float16", "use_mla": True},
    "block_allocation_records": [{"req_id": "r", "new_block_ids": [1, 2], "new_token_ids": [300]}],
    "session_end_info": {"finish_reason": "stop", "stop_token_id": -1},
    # Responses.
    "register_response": {"shm_name": "lmcache_l1_pool_x", "pool_size": 4096,
                          "scratch_offset": 0, "scratch_size": 0, "error": None},
    "prepare_store_response": {"context": {"slots": [
        {"offset": 4096, "length": 1024, "shape": (2, 1, 256, 1), "dtype": "float16"}],
        "chunk_indices": [0]}},
    "prepare_store_response_all_cached": {"context": {"slots": [], "chunk_indices": []}},
    "prepare_store_response_refused": {"context": {}},
    "prepare_retrieve_response": {"success": True, "data": b"", "context": {"slots": [
        {"offset": 0, "length": 33554432, "shape": (2, 32, 256, 1024), "dtype": "float16"},
        {"offset": 33554432, "length": 33554432, "shape": (2, 32, 256, 1024), "dtype": "float16"}]}},
    "prepare_retrieve_response_failed": {"success": False, "data": b"", "context": {}},
    "transfer_reply_rejected": (b"", False),
    "error_reply": {"error_type": "ValueError", "message": "x"},
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, value in sorted(FRAMES.items()):
        with open(os.path.join(OUT, name + ".msgpack"), "wb") as f:
            f.write(msgpack.packb(value, use_bin_type=True))
    print("wrote %d frames to %s" % (len(FRAMES), OUT))


if __name__ == "__main__":
    main()
