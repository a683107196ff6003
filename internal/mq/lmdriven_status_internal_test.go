package mq

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/lmcache-go/lmcache/internal/kvlayout"
)

// TestLMDStatusJSON: cache_context_meta (typed httpapi.CacheContext)
// encodes to exactly the JSON the former map[string]any built, keys sorted at
// every level, and cache_size_per_token is the chunk formula at one token
// (2·layers·hidden·item, or layers·latent·item for MLA).
func TestLMDStatusJSON(t *testing.T) {
	st := &state{lmd: lmDriven{regs: map[int64]*lmdReg{
		7: {instance: 7, model: "m", world: 2, layout: &kvlayout.Layout{Format: kvlayout.FormatNHD, Dtype: "float16", ItemSize: 2, NumLayers: 3, NumBlocks: 10, BlockSize: 16, NumHeads: 4, HeadSize: 8}},
		3: {instance: 3, model: "x", world: 1, layout: &kvlayout.Layout{Format: kvlayout.FormatMLA, Dtype: "bfloat16", ItemSize: 2, NumLayers: 2, NumBlocks: 5, BlockSize: 64, NumHeads: 1, HeadSize: 576}},
	}}}
	meta, ids := st.lmdStatus([]int64{9})
	if !slices.Equal(ids, []int64{3, 7, 9}) {
		t.Fatalf("registered ids %v, want [3 7 9]", ids)
	}
	got, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"3":{"kv_cache_layout":{"cache_size_per_token":2304,"kernel_groups":[{"dtype":"torch.bfloat16","engine_group_idx":0,"engine_kv_format":"MLA","head_size":576,"is_mla":true,"kernel_group_idx":0,"layer_indices":[0,1],"num_kv_heads":1,"num_layers":2,"object_group_idx":0,"slots_per_block":64,"tokens_per_block":64}],"num_blocks":5,"num_layers":2},"model_name":"x","transfer":"lmcache_driven","world_size":1},` +
		`"7":{"kv_cache_layout":{"cache_size_per_token":384,"kernel_groups":[{"dtype":"torch.float16","engine_group_idx":0,"engine_kv_format":"NHD","head_size":8,"is_mla":false,"kernel_group_idx":0,"layer_indices":[0,1,2],"num_kv_heads":4,"num_layers":3,"object_group_idx":0,"slots_per_block":16,"tokens_per_block":16}],"num_blocks":10,"num_layers":3},"model_name":"m","transfer":"lmcache_driven","world_size":2}}`
	if string(got) != want {
		t.Fatalf("cache_context_meta\n got %s\nwant %s", got, want)
	}
}
