package dax

// SetAfterCopy installs the hook Store runs between its copies and their
// commit.
func SetAfterCopy(a *Adapter, f func()) { a.afterCopy = f }
