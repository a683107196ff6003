package coordinator

// APIErrorsHideInternal reports whether the coordinator's error table hides
// unmapped errors (and recovered panics) behind a bare 500.
func APIErrorsHideInternal() bool { return apiErrors.HideInternal }

// MaxL1Facts is the L1 view's key bound.
func MaxL1Facts() int { return maxL1Facts }

// SetMaxL1Facts lowers the L1 view's bound for a test and returns a
// function restoring it.
func SetMaxL1Facts(n int) (restore func()) {
	old := maxL1Facts
	maxL1Facts = n
	return func() { maxL1Facts = old }
}
