// Package nodeward carries the files that belong to the whole product rather
// than to one package: the OpenAPI contract, embedded so the server serves
// the very file the tests validate against.
package nodeward

import _ "embed"

// OpenAPI is openapi.yaml, served at /openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte
