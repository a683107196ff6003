package coordinator

// MaxQuotas is the quota table's bound for client requests.
var MaxQuotas = maxQuotas

// SetMaxQuotas lowers the quota table's bound for a test and returns a
// function restoring it. Set it before starting a coordinator and restore
// it after the coordinator stopped.
func SetMaxQuotas(n int) (restore func()) {
	old := maxQuotas
	maxQuotas = n
	return func() { maxQuotas = old }
}
