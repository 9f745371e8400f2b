package handlers

// NullableFieldNames lists the JSON names of the request fields the
// decoder reads null as absent for, for the contract check in
// package handlers_test.
func NullableFieldNames() map[string]bool {
	out := map[string]bool{}
	for _, fields := range nullable {
		for name := range fields {
			out[name] = true
		}
	}
	return out
}
