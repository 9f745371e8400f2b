// Package testkinds holds kinds of operation that exist for tests and
// benchmarks only: a no-op, a run that blocks until it is stopped, and a
// level-triggered run that blocks on its first attempt. A normal build
// serves none of them; a server built with the build tag
// nodeward_testkinds registers them (see Register), so end-to-end tests
// can count executions across real processes and restarts.
package testkinds

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
)

// Family is the test kinds' family; no package host can be granted it,
// and the kinds are admin-only besides.
const Family = "test"

// Kind names.
const (
	// KindNoop succeeds at once.
	KindNoop = "test.noop"
	// KindBlock runs until its context ends (cancel, deadline, stop).
	KindBlock = "test.block"
	// KindLevel is level-triggered: it blocks on its first attempt and
	// succeeds on any later one, so a restart that re-runs it shows.
	KindLevel = "test.level"
)

// EnvDir names the folder where, when set, every run appends one line
// "<kind> <operation id> <attempt> <replica>" to a file of its own process.
const EnvDir = "NODEWARD_TEST_KINDS_DIR"

// Kinds answers the test kinds of a replica; runs are recorded under dir
// when it is not empty.
func Kinds(replica, dir string) []*ledger.Kind {
	rec := &recorder{replica: replica, dir: dir}
	return []*ledger.Kind{
		{Name: KindNoop, Family: Family, AdminOnly: true, Prepare: prepare,
			Run: func(ctx context.Context, op ledger.Operation) (json.RawMessage, error) {
				return nil, rec.record(op)
			}},
		{Name: KindBlock, Family: Family, AdminOnly: true, Prepare: prepare,
			Run: func(ctx context.Context, op ledger.Operation) (json.RawMessage, error) {
				if err := rec.record(op); err != nil {
					return nil, err
				}
				<-ctx.Done()
				return nil, ctx.Err()
			}},
		{Name: KindLevel, Family: Family, AdminOnly: true, LevelTriggered: true, Prepare: prepare,
			Run: func(ctx context.Context, op ledger.Operation) (json.RawMessage, error) {
				if err := rec.record(op); err != nil {
					return nil, err
				}
				if op.Attempt <= 1 {
					<-ctx.Done()
					return nil, ctx.Err()
				}
				return nil, nil
			}},
	}
}

// prepare accepts an empty operation without targets.
func prepare(_ context.Context, d *ledger.Draft) error {
	var body struct{}
	if err := ledger.DecodeOperation(d.Operation, &body); err != nil {
		return err
	}
	var v errcode.Validation
	v.Check(len(d.Targets) == 0, "targets", "test kinds take no targets")
	return v.Err()
}

// unsafeName matches what may not appear in a file name.
var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// recorder appends one line per run to this process's file. Each line is
// one write on a file opened O_APPEND, so lines of several processes and
// goroutines never interleave.
type recorder struct {
	replica, dir string

	once sync.Once
	f    *os.File
	err  error
}

func (r *recorder) record(op ledger.Operation) error {
	if r.dir == "" {
		return nil
	}
	r.once.Do(func() {
		name := unsafeName.ReplaceAllString(r.replica, "_") + "-" + strconv.Itoa(os.Getpid()) + ".runs"
		r.f, r.err = os.OpenFile(filepath.Join(r.dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	})
	if r.err != nil {
		return fmt.Errorf("testkinds: open record file: %w", r.err)
	}
	_, err := fmt.Fprintf(r.f, "%s %s %d %s\n", op.Kind, op.ID, op.Attempt, r.replica)
	return err
}
