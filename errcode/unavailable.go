package errcode

import "sync"

var (
	unavailableMu sync.RWMutex // guards unavailableChecks
	// unavailableChecks recognise errors that mean a dependency (the
	// database) could not be reached or could not take a write right now.
	unavailableChecks []func(error) bool
)

// RegisterUnavailable adds a check that recognises an error meaning "the
// database is unreachable or cannot take writes right now" (connection
// refused or lost, server shutting down, disk full). The package that owns
// the driver registers it, so the HTTP edge can answer such errors 503
// unavailable with Retry-After — a condition the client retries — instead
// of a 500 without importing any driver.
func RegisterUnavailable(check func(error) bool) {
	unavailableMu.Lock()
	unavailableChecks = append(unavailableChecks, check)
	unavailableMu.Unlock()
}

// IsUnavailable reports whether a registered check recognises err.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	unavailableMu.RLock()
	defer unavailableMu.RUnlock()
	for _, check := range unavailableChecks {
		if check(err) {
			return true
		}
	}
	return false
}
