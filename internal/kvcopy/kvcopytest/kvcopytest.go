// Package kvcopytest plays an LMCache client's side of the lmcache-driven
// path in tests: POSIX shared-memory segments for a paged KV cache, tensor
// wrapper pickles made by Debian's python3 from stand-in classes with
// upstream's module and class names, and REGISTER_KV_CACHE's frames.
package kvcopytest

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"golang.org/x/sys/unix"

	"github.com/lmcache-go/lmcache/internal/gpucheck"
	"github.com/lmcache-go/lmcache/internal/wire"
)

// CPUShmPickler prints one CpuShmTensorWrapper pickle (hex) per JSON spec
// in argv[1] ({name, nbytes, shape, stride}; float16, storage offset 0).
const CPUShmPickler = gpucheck.PicklerPrelude + `
W = stub("lmcache.v1.platform.cpu.shm", "CpuShmTensorWrapper")
for t in json.loads(sys.argv[1]):
    w = W.__new__(W)
    w.__dict__.update(shm_name=t["name"], nbytes=t["nbytes"], handle=None, dtype=torch.float16,
        shape=tuple(t["shape"]), stride=tuple(t["stride"]), storage_offset=0, device_uuid="cpu")
    print(pickle.dumps(w, protocol=4).hex())
`

var seq atomic.Int64

// Segment creates a /dev/shm segment of size bytes filled from r, as the
// client does; it is unmapped and removed when the test ends. The name
// has no leading "/".
func Segment(t testing.TB, tag string, size int, r *rand.Rand) (string, []byte) {
	t.Helper()
	name := fmt.Sprintf("lmcache_kv_%s_%d_%d", tag, os.Getpid(), seq.Add(1))
	path := filepath.Join("/dev/shm", name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(path) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	_ = unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
	for i := range m {
		m[i] = byte(r.Uint32())
	}
	return name, m
}

// Wrappers runs a pickler script (CPUShmPickler, gpucheck.CUDAPickler)
// over specs with python3 and returns REGISTER_KV_CACHE's kv_caches
// frame: a msgpack array of one ext-1 pickle per tensor.
func Wrappers(t testing.TB, script string, specs []map[string]any) []byte {
	t.Helper()
	arg, err := json.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required to build wrapper pickles: %v", err)
	}
	out, err := exec.Command(py, "-c", script, string(arg)).Output()
	if err != nil {
		t.Fatalf("pickler: %v", err)
	}
	lines := strings.Fields(string(out))
	kv := msgp.AppendArrayHeader(nil, uint32(len(lines)))
	for _, l := range lines {
		p, err := hex.DecodeString(l)
		if err != nil {
			t.Fatal(err)
		}
		if kv, err = msgp.AppendExtension(kv, &msgp.RawExtension{Type: 1, Data: p}); err != nil {
			t.Fatal(err)
		}
	}
	return kv
}

// RegisterFrames are REGISTER_KV_CACHE's 7 payload frames: instance_id,
// kv_caches (from Wrappers), model_name, world_size, engine_type "vllm",
// layout_hints (kv_layout and tokens_per_block, each left out when
// empty or 0) and an empty engine_group_infos.
func RegisterFrames(inst int64, kvCaches []byte, model string, world int64, kvLayout string, tokensPerBlock int) [][]byte {
	n := uint32(0)
	if kvLayout != "" {
		n++
	}
	if tokensPerBlock > 0 {
		n++
	}
	hints := msgp.AppendMapHeader(nil, n)
	if kvLayout != "" {
		hints = msgp.AppendString(hints, "kv_layout")
		hints = msgp.AppendString(hints, kvLayout)
	}
	if tokensPerBlock > 0 {
		hints = msgp.AppendString(hints, "tokens_per_block")
		hints = msgp.AppendInt(hints, tokensPerBlock)
	}
	return [][]byte{wire.EncodeInt(inst), kvCaches, msgp.AppendString(nil, model), wire.EncodeInt(world),
		msgp.AppendString(nil, "vllm"), hints, wire.EmptyList}
}
