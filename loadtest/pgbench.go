package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// pgbenchDB is the throwaway database the reference runs in.
const pgbenchDB = "nodeward_pgbench"

var tpsLine = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)

// pgbench runs the reference of DECISIONS.md §31 on the Postgres server of
// baseURL: `pgbench -i -s 10`, then `pgbench -N -c 32 -j 2 -T 30`, in a
// database created for it and dropped after. It answers the tps.
func pgbench(ctx context.Context, baseURL string, log io.Writer) (float64, error) {
	bin, err := exec.LookPath("pgbench")
	if err != nil {
		return 0, errors.New("pgbench not found: install postgresql-client (or postgresql-contrib)")
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		return 0, errors.New("psql not found: install postgresql-client")
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return 0, errors.New("database URL does not parse")
	}
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	adminURL := u.String()
	u.Path = "/" + pgbenchDB
	benchURL := u.String()

	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	run := func(name string, args ...string) (string, error) {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdout = &out
		cmd.Stderr = &out
		err := cmd.Run()
		if err != nil {
			return out.String(), fmt.Errorf("%s: %v\n%s", name, err, out.String())
		}
		return out.String(), nil
	}
	drop := func() error {
		_, err := run(psql, adminURL, "-q", "-c", "DROP DATABASE IF EXISTS "+pgbenchDB)
		return err
	}
	if err := drop(); err != nil {
		return 0, err
	}
	if _, err := run(psql, adminURL, "-q", "-c", "CREATE DATABASE "+pgbenchDB); err != nil {
		return 0, err
	}
	defer func() { _ = drop() }()
	if _, err := run(bin, "-i", "-s", "10", "-q", benchURL); err != nil {
		return 0, err
	}
	out, err := run(bin, "-N", "-c", "32", "-j", "2", "-T", "30", benchURL)
	if err != nil {
		return 0, err
	}
	fmt.Fprint(log, out)
	m := tpsLine.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps line:\n%s", out)
	}
	return strconv.ParseFloat(m[1], 64)
}
