package auth_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/keys"
)

func TestValidatePackageHost(t *testing.T) {
	good := []string{"deployer", "a", strings.Repeat("é", 64), "ci / eu-west ✓", "名前"}
	for _, name := range good {
		fams, err := auth.ValidatePackageHost(name, []string{"nodes", "commands", "nodes"}, "")
		require.NoError(t, err, "%q", name)
		require.Equal(t, []string{"commands", "nodes"}, fams, "sorted, without repeats")
	}
	bad := map[string]string{
		"empty": "", "too long": strings.Repeat("n", 65), "control": "a\x00b", "newline": "a\nb", "escape": "a\x1b[31m",
		"bidi override": "a\u202eb", "bidi isolate": "a\u2066b", "rtl mark": "a\u200fb", "invalid utf-8": "a\xffb",
		"replacement": "a\ufffdb", "padded": " a", "trailing space": "a ",
	}
	for what, name := range bad {
		_, err := auth.ValidatePackageHost(name, []string{"nodes"}, "operation/")
		requireField(t, err, "operation/name", what)
	}
	for what, fams := range map[string][]string{
		"none": nil, "empty": {}, "credentials": {"nodes", "credentials"}, "unknown": {"telepathy"}, "case": {"Nodes"},
	} {
		_, err := auth.ValidatePackageHost("ok", fams, "")
		requireField(t, err, "families", what)
	}
}

func requireField(t *testing.T, err error, field, what string) {
	t.Helper()
	var e *errcode.Error
	require.True(t, errors.As(err, &e), "%s: %v", what, err)
	require.Equal(t, errcode.ValidationFailed, e.Code, what)
	require.Equal(t, field, e.Fields[0].Field, what)
}

func TestPackageHostTokensNeedAMasterKey(t *testing.T) {
	s := auth.New(auth.Options{Keys: keys.NewRing()})
	_, err := s.PackageHostToken(context.Background(), "op", "host", 1)
	require.ErrorIs(t, err, keys.ErrNoKey, "an empty key ring mints nothing")
}
