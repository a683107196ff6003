package dax_test

import (
	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/l2/dax"
)

// The engine passes /reconfigure through to adapters that implement its
// Reconfigurer; the DAX adapter must stay one.
var _ engine.Reconfigurer = (*dax.Adapter)(nil)
