package httpapi_test

import (
	"crypto/md5"
	"hash"
)

func md5New() hash.Hash { return md5.New() }
