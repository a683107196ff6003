package fs

import "github.com/lmcache-go/lmcache/internal/objkey"

// Test access to the temp file naming.
var TmpHost = tmpHost

const TmpPrefix = tmpPrefix

// TmpOwner is this process's part of its temp file names.
var TmpOwner = tmpOwner

// SetHooks installs the store and delete interleaving hooks.
func SetHooks(a *Adapter, afterRename, afterRemove func(objkey.Key)) {
	a.afterRename, a.afterRemove = afterRename, afterRemove
}

// SetDirSynced installs the hook run after fsync synced a directory.
func SetDirSynced(a *Adapter, f func(dir string)) { a.dirSynced = f }

// SetDirRead installs the hook run after List read base_path.
func SetDirRead(a *Adapter, f func()) { a.dirRead = f }
