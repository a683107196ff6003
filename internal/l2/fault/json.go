package fault

import (
	"bytes"
	"encoding/json"
)

// jsonInto decodes strictly: integers must be integers.
func jsonInto(raw json.RawMessage, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	return dec.Decode(dst)
}
