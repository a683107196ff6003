package coordinator

// APIErrorsHideInternal reports whether the coordinator's error table hides
// unmapped errors (and recovered panics) behind a bare 500.
func APIErrorsHideInternal() bool { return apiErrors.HideInternal }
