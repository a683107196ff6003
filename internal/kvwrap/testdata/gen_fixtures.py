#!/usr/bin/python3
"""Builds the wrapper pickles the kvwrap tests decode.

Run with Debian's /usr/bin/python3 (no torch, no lmcache needed):

    /usr/bin/python3 internal/kvwrap/testdata/gen_fixtures.py internal/kvwrap/testdata

Stand-in classes carry the module and qualified names of LMCache's tensor
wrappers and of torch's dtype objects, so pickle writes exactly the globals a
real client writes (a class global, NEWOBJ with an empty tuple, a state dict,
BUILD; dtypes as the global torch.<name>). Nothing here is copied from
upstream: the field sets are the ones described in
/work/shared/research/datapath.md section 3.2 and lmcache_driven_cpu.md.
"""

import os
import pickle
import sys
import types


def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
    return sys.modules[name]


class _Dtype:
    """Pickles as the global torch.<name>, as torch.dtype does."""

    __module__ = "torch"

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return self.name


torch = _module("torch")
for _n in ("float16", "bfloat16", "float32", "uint8", "float8_e4m3fn", "int8"):
    setattr(torch, _n, _Dtype(_n))


def _wrapper_class(module, name):
    mod = _module(module)
    cls = type(name, (object,), {})
    cls.__module__ = module
    cls.__qualname__ = name
    setattr(mod, name, cls)
    return cls


def _new(cls, state):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


CpuShm = _wrapper_class("lmcache.v1.platform.cpu.shm", "CpuShmTensorWrapper")
CpuShmNew = _wrapper_class("lmcache.v1.platform.backends.cpu.shm", "CpuShmTensorWrapper")
CudaIPC = _wrapper_class("lmcache.v1.multiprocess.custom_types", "CudaIPCWrapper")
DeviceIPC = _wrapper_class("lmcache.v1.platform.cuda.ipc_wrapper", "CudaIPCWrapper")
Evil = _wrapper_class("lmcache.v1.platform.cpu.shm", "NotAWrapper")


def cpu_state(name, nbytes, dtype, shape, stride, offset):
    return {
        "shm_name": name,
        "nbytes": nbytes,
        "handle": None,
        "dtype": getattr(torch, dtype),
        "shape": tuple(shape),
        "stride": tuple(stride),
        "storage_offset": offset,
        "device_uuid": "cpu",
    }


def contiguous(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def main(outdir):
    fixtures = {}
    # 36f20944-era wrapper: nbytes is the view's span, offset 0, NHD layer.
    shape = (2, 8, 16, 4, 64)
    fixtures["cpu_nhd_p4.pkl"] = (
        _new(CpuShm, cpu_state("/lmcache_kv_4242_0", 2 * 8 * 16 * 4 * 64 * 2, "bfloat16", shape, contiguous(shape), 0)),
        4,
    )
    # Newest wrapper: layer 1 of a shared segment at a nonzero element offset,
    # nbytes is the whole segment.
    shape = (2, 8, 4, 16, 64)
    n = 2 * 8 * 4 * 16 * 64
    fixtures["cpu_hnd_shared_p5.pkl"] = (
        _new(CpuShmNew, cpu_state("/lmcache_kv_4242_1", 3 * n * 2, "float16", shape, contiguous(shape), n)),
        5,
    )
    # MLA rank-3 latent cache, fp8 bytes.
    shape = (8, 16, 576)
    fixtures["cpu_mla_fp8_p4.pkl"] = (
        _new(CpuShm, cpu_state("/lmcache_kv_4242_2", 8 * 16 * 576, "float8_e4m3fn", shape, contiguous(shape), 0)),
        4,
    )
    # CUDA IPC wrapper with the 8-tuple handle of UntypedStorage._share_cuda_().
    shape = (2, 8, 16, 4, 64)
    handle = (0, bytes(range(64)), 1 << 20, 4096, b"/torch_refcount_1", 8, bytes(range(64, 128)), True)
    fixtures["cuda_ipc_p4.pkl"] = (
        _new(CudaIPC, {
            "handle": handle,
            "dtype": torch.float16,
            "shape": shape,
            "stride": contiguous(shape),
            "storage_offset": 0,
            "device_uuid": "GPU-8b4c6a8e-1111-2222-3333-444455556666",
        }),
        4,
    )
    fixtures["cuda_ipc_p5.pkl"] = (
        _new(DeviceIPC, dict(fixtures["cuda_ipc_p4.pkl"][0].__dict__)),
        5,
    )
    # Refused: a class outside the allow-list, a callable global, and
    # protocol 2 (bytes become a _codecs.encode call).
    fixtures["bad_class_p4.pkl"] = (_new(Evil, cpu_state("/x", 2, "uint8", (2,), (1,), 0)), 4)
    fixtures["bad_proto2.pkl"] = (fixtures["cuda_ipc_p4.pkl"][0], 2)

    for name, (obj, proto) in sorted(fixtures.items()):
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(pickle.dumps(obj, protocol=proto))

    class _System:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(os.path.join(outdir, "bad_reduce_os_system.pkl"), "wb") as f:
        f.write(pickle.dumps(_System(), protocol=4))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
