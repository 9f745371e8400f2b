//go:build race

package handlers_test

const raceEnabled = true
