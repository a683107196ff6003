package dax

// SetAfterCopy installs the hook Store runs between its copies and their
// commit.
func SetAfterCopy(a *Adapter, f func()) { a.afterCopy = f }

// SetAfterCommit installs the hook Store runs between its commit and its
// report (usage count and OnStored).
func SetAfterCommit(a *Adapter, f func()) { a.afterCommit = f }

// SetBeforeMove installs the hook Resize runs between its checks and the
// moves off the cut-off range.
func SetBeforeMove(a *Adapter, f func()) { a.beforeMove = f }

// SetMapFault makes every new mapping of the device at path fail with the
// error f returns (nil: map as usual); the old mapping is released first,
// as a real failed remap leaves it.
func SetMapFault(a *Adapter, path string, f func(size int64) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.devices {
		if d.path == path {
			d.mapFault = f
		}
	}
}
