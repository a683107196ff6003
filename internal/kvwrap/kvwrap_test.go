package kvwrap

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("fixture %s: %v (regenerate with /usr/bin/python3 testdata/gen_fixtures.py testdata)", name, err)
	}
	return b
}

func contiguous(shape []int64) []int64 {
	out := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		out[i] = acc
		acc *= shape[i]
	}
	return out
}

func TestDecodeCPUShmFixtures(t *testing.T) {
	cases := []struct {
		file      string
		class     string
		dtype     string
		item      int64
		shape     []int64
		offset    int64
		shm       string
		nbytes    int64
		extentEnd int64
	}{
		{"cpu_nhd_p4.pkl", "lmcache.v1.platform.cpu.shm.CpuShmTensorWrapper", "bfloat16", 2,
			[]int64{2, 8, 16, 4, 64}, 0, "lmcache_kv_4242_0", 2 * 8 * 16 * 4 * 64 * 2, 2 * 8 * 16 * 4 * 64 * 2},
		{"cpu_hnd_shared_p5.pkl", "lmcache.v1.platform.backends.cpu.shm.CpuShmTensorWrapper", "float16", 2,
			[]int64{2, 8, 4, 16, 64}, 65536, "lmcache_kv_4242_1", 3 * 65536 * 2, 2 * 65536 * 2},
		{"cpu_mla_fp8_p4.pkl", "lmcache.v1.platform.cpu.shm.CpuShmTensorWrapper", "float8_e4m3fn", 1,
			[]int64{8, 16, 576}, 0, "lmcache_kv_4242_2", 8 * 16 * 576, 8 * 16 * 576},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			w, err := Decode(fixture(t, c.file))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if w.Kind != KindCPUShm || w.Class != c.class || w.Dtype != c.dtype || w.ItemSize != c.item {
				t.Fatalf("got kind %v class %q dtype %q item %d", w.Kind, w.Class, w.Dtype, w.ItemSize)
			}
			if !slices.Equal(w.Shape, c.shape) || !slices.Equal(w.Stride, contiguous(c.shape)) {
				t.Fatalf("shape %v stride %v, want %v %v", w.Shape, w.Stride, c.shape, contiguous(c.shape))
			}
			if w.StorageOffset != c.offset || w.ShmName != c.shm || w.NBytes != c.nbytes || w.DeviceUUID != "cpu" {
				t.Fatalf("offset %d shm %q nbytes %d uuid %q", w.StorageOffset, w.ShmName, w.NBytes, w.DeviceUUID)
			}
			ext, err := w.Extent()
			if err != nil || ext != c.extentEnd {
				t.Fatalf("Extent = %d, %v; want %d", ext, err, c.extentEnd)
			}
			if !w.Contiguous() || w.CUDA != nil {
				t.Fatalf("contiguous %v cuda %v", w.Contiguous(), w.CUDA)
			}
		})
	}
}

func TestDecodeCUDAIPCFixtures(t *testing.T) {
	for _, f := range []string{"cuda_ipc_p4.pkl", "cuda_ipc_p5.pkl"} {
		t.Run(f, func(t *testing.T) {
			w, err := Decode(fixture(t, f))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if w.Kind != KindCUDAIPC || w.Dtype != "float16" || w.DeviceUUID != "GPU-8b4c6a8e-1111-2222-3333-444455556666" {
				t.Fatalf("kind %v dtype %q uuid %q", w.Kind, w.Dtype, w.DeviceUUID)
			}
			h := w.CUDA
			if h == nil || h.Device != 0 || h.StorageBytes != 1<<20 || h.StorageOffsetBytes != 4096 ||
				h.RefCounterOffset != 8 || !h.EventSyncRequired || string(h.RefCounterHandle) != "/torch_refcount_1" {
				t.Fatalf("handle %+v", h)
			}
			want := make([]byte, 128)
			for i := range want {
				want[i] = byte(i)
			}
			if !bytes.Equal(h.MemHandle, want[:64]) || !bytes.Equal(h.EventHandle, want[64:]) {
				t.Fatalf("mem %x event %x", h.MemHandle, h.EventHandle)
			}
		})
	}
}

func TestDecodeRefusesForeignGlobals(t *testing.T) {
	cases := map[string]error{
		"bad_class_p4.pkl":         ErrRefused, // lmcache module, unknown class name
		"bad_reduce_os_system.pkl": ErrRefused, // REDUCE of posix.system
		"bad_proto2.pkl":           ErrRefused, // bytes as _codecs.encode calls
	}
	for f, want := range cases {
		t.Run(f, func(t *testing.T) {
			_, err := Decode(fixture(t, f))
			if !errors.Is(err, want) {
				t.Fatalf("Decode error = %v, want %v", err, want)
			}
		})
	}
}

func TestDecodeBounds(t *testing.T) {
	good := fixture(t, "cpu_nhd_p4.pkl")
	cases := []struct {
		name string
		p    []byte
		want error
	}{
		{"too big", make([]byte, MaxPickleBytes+1), ErrTooLarge},
		{"empty", nil, ErrMalformed},
		{"truncated", good[:len(good)-1], ErrMalformed},
		{"trailing bytes", append(slices.Clone(good), 'N'), ErrMalformed},
		// BINBYTES8 claiming 2^62 bytes must fail before any allocation.
		{"forged length", []byte{0x80, 4, 0x8e, 0, 0, 0, 0, 0, 0, 0, 0x40, '.'}, ErrMalformed},
		{"deep marks", append([]byte{0x80, 4}, bytes.Repeat([]byte{'('}, maxMarkDepth+1)...), ErrTooLarge},
		{"big memo index", []byte{0x80, 4, 'N', 'r', 0xff, 0xff, 0, 0, '.'}, ErrTooLarge},
		{"protocol 1", []byte{0x80, 1, 'N', '.'}, ErrRefused},
		{"reduce opcode", []byte{0x80, 4, 'N', ')', 'R', '.'}, ErrRefused},
		{"not a wrapper", []byte{0x80, 4, 'N', '.'}, ErrRefused},
		// gopickle panics on this; the recover fence makes it an error.
		{"empty LONG1", []byte{0x80, 4, 0x8a, 0, '.'}, ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.p)
			if !errors.Is(err, c.want) {
				t.Fatalf("Decode error = %v, want %v", err, c.want)
			}
		})
	}
}

func TestShmName(t *testing.T) {
	for in, want := range map[string]string{"/lmcache_kv_1_0": "lmcache_kv_1_0", "seg": "seg"} {
		got, err := ShmName(in)
		if err != nil || got != want {
			t.Errorf("ShmName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "/", "//x", "/a/b", "../x", "/x..y", ".", "a\x00b"} {
		if _, err := ShmName(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ShmName(%q) error = %v, want ErrMalformed", bad, err)
		}
	}
}

// TestFixturesMatchGenerator regenerates the fixtures with Debian's
// python3 and checks the committed files are what the script produces, so
// the fixtures never drift from the documented generator.
func TestFixturesMatchGenerator(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required to check the fixtures: %v", err)
	}
	dir := t.TempDir()
	out, err := exec.Command(py, filepath.Join("testdata", "gen_fixtures.py"), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("gen_fixtures.py: %v\n%s", err, out)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*.pkl"))
	if len(names) != 8 {
		t.Fatalf("generator wrote %d fixtures, want 8", len(names))
	}
	for _, n := range names {
		got, _ := os.ReadFile(n)
		if want := fixture(t, filepath.Base(n)); !bytes.Equal(got, want) {
			t.Errorf("%s differs from the generator's output", filepath.Base(n))
		}
	}
}
