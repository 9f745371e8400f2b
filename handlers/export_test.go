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

// APIQueryParameters answers the query parameters each /api/v1 route
// takes, by "METHOD /api/v1/pattern", for the contract check in package
// handlers_test.
func APIQueryParameters() map[string][]string {
	out := map[string][]string{}
	for _, rt := range apiRoutes {
		out[rt.method+" /api/v1"+rt.pattern] = rt.query
	}
	return out
}

// ClientAddr is clientAddr, for the table test in package handlers_test.
var ClientAddr = clientAddr
