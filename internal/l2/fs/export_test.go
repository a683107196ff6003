package fs

// Test access to the temp file naming.
var TmpHost = tmpHost

const TmpPrefix = tmpPrefix
