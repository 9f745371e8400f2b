package retryafter

import (
	"net/http"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"  ", 0},
		{"5", 5 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"0", 0},
		{"-3", 0},
		{"soon", 0},
		{"1.5", 0},
		{time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), 0},
	} {
		if got := Parse(tc.in); got != tc.want {
			t.Errorf("Parse(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	// An HTTP date an hour ahead is about an hour (the format has whole seconds).
	ahead := Parse(time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
	if ahead < 58*time.Minute || ahead > time.Hour {
		t.Errorf("an HTTP date an hour ahead: %v", ahead)
	}
}
