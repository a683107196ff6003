// Package e2e holds end-to-end tests that run the real `lmcache` binary as
// separate processes (coordinator and servers) against a real S3 server
// (versitygw). It has no non-test code.
package e2e
