package testkinds

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
)

// TestRegisterFollowsTheBuildTag: a normal build registers nothing; a
// build tagged nodeward_testkinds registers the three kinds.
func TestRegisterFollowsTheBuildTag(t *testing.T) {
	r := ledger.NewRegistry()
	Register(r, "replica-a")
	for _, name := range []string{KindNoop, KindBlock, KindLevel} {
		_, ok := r.Kind(name)
		require.Equal(t, Enabled, ok, "kind %s served", name)
	}
	if !Enabled {
		require.Empty(t, r.Kinds())
	}
}

func kinds(t *testing.T, dir string) map[string]*ledger.Kind {
	out := map[string]*ledger.Kind{}
	for _, k := range Kinds("replica/a", dir) {
		out[k.Name] = k
		require.Equal(t, Family, k.Family)
		require.True(t, k.AdminOnly, "no package host may submit %s", k.Name)
	}
	return out
}

func TestRunsAreRecorded(t *testing.T) {
	dir := t.TempDir()
	ks := kinds(t, dir)
	require.True(t, ks[KindLevel].LevelTriggered)
	require.False(t, ks[KindNoop].LevelTriggered || ks[KindBlock].LevelTriggered)

	_, err := ks[KindNoop].Run(context.Background(), ledger.Operation{ID: "op-1", Kind: KindNoop, Attempt: 1})
	require.NoError(t, err)

	// test.block and the first attempt of test.level run until stopped.
	for _, op := range []ledger.Operation{{ID: "op-2", Kind: KindBlock, Attempt: 1}, {ID: "op-3", Kind: KindLevel, Attempt: 1}} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := ks[op.Kind].Run(ctx, op); done <- err }()
		select {
		case err := <-done:
			t.Fatalf("%s returned before it was stopped: %v", op.Kind, err)
		default:
		}
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}
	// A later attempt of test.level succeeds at once.
	_, err = ks[KindLevel].Run(context.Background(), ledger.Operation{ID: "op-3", Kind: KindLevel, Attempt: 2})
	require.NoError(t, err)

	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, files, 1, "one file per process")
	require.Equal(t, "replica_a-"+strconv.Itoa(os.Getpid())+".runs", files[0].Name())
	raw, err := os.ReadFile(filepath.Join(dir, files[0].Name()))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, 4)
	require.Contains(t, lines, "test.noop op-1 1 replica/a")
	require.Contains(t, lines, "test.block op-2 1 replica/a")
	require.Contains(t, lines, "test.level op-3 1 replica/a")
	require.Contains(t, lines, "test.level op-3 2 replica/a")
}

func TestNoDirRecordsNothing(t *testing.T) {
	_, err := kinds(t, "")[KindNoop].Run(context.Background(), ledger.Operation{ID: "op-1", Kind: KindNoop, Attempt: 1})
	require.NoError(t, err)
}

func TestPrepareRefusesBodiesAndTargets(t *testing.T) {
	k := kinds(t, "")[KindNoop]
	require.NoError(t, k.Prepare(context.Background(), &ledger.Draft{Operation: json.RawMessage(`{}`)}))
	err := k.Prepare(context.Background(), &ledger.Draft{Operation: json.RawMessage(`{"x":1}`)})
	require.Equal(t, errcode.InvalidJSON, errcode.Of(err))
	err = k.Prepare(context.Background(), &ledger.Draft{Operation: json.RawMessage(`{}`), Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "n"}}})
	require.Equal(t, errcode.ValidationFailed, errcode.Of(err))
}
