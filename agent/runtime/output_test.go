package runtime

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

func TestTailText(t *testing.T) {
	limit := api.MaxOutputTail
	for name, c := range map[string]struct {
		in        []byte
		cut       bool
		want      string
		truncated bool
	}{
		"Empty":                       {in: nil, want: ""},
		"Plain":                       {in: []byte("hello\n"), want: "hello\n"},
		"InvalidUTF8Replaced":         {in: []byte("a\xff\xfeb"), want: "a\uFFFDb"},
		"NULReplaced":                 {in: []byte("a\x00b"), want: "a\uFFFDb"},
		"SplitCharacterDropped":       {in: []byte("\xa9tail"), cut: true, want: "tail", truncated: true},
		"SplitCharacterKeptWhenWhole": {in: []byte("\xa9tail"), want: "\uFFFDtail"},
		"LongerThanTheLimit":          {in: append([]byte("drop"), bytes.Repeat([]byte("x"), limit)...), want: strings.Repeat("x", limit), truncated: true},
		"ExactlyTheLimit":             {in: bytes.Repeat([]byte("y"), limit), want: strings.Repeat("y", limit)},
		// Each invalid byte grows to three: the text is trimmed again, at a
		// character boundary, and says it was truncated.
		"ReplacementGrowsPastTheLimit": {in: bytes.Repeat([]byte("\x00"), limit), want: strings.Repeat("\uFFFD", limit/3), truncated: true},
	} {
		t.Run(name, func(t *testing.T) {
			got, truncated := TailText(c.in, c.cut)
			require.Equal(t, c.want, got)
			require.Equal(t, c.truncated, truncated)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, len(got), limit)
		})
	}
}

func TestProcessOutput(t *testing.T) {
	t.Parallel()
	p := newProcess(t, t.TempDir())
	ctx := context.Background()
	_, err := p.Output(ctx, "run-o", "a1")
	require.ErrorIs(t, err, ErrUnknownWorkload)

	// 70,000 bytes of stdout ending in a known line; stderr short, with an
	// invalid byte.
	script := `head -c 70000 /dev/zero | tr '\0' 'z'; echo; echo last line; printf 'bad \377 byte\n' >&2`
	require.NoError(t, p.Launch(ctx, api.LaunchWorkload{RunID: "run-o", AttemptID: "a1", Command: "sh", Args: []string{"-c", script}}))
	testwait.For(t, "the exit", 20*time.Second, func() bool {
		o, _ := observation(t, p, "run-o", "a1")
		return o.State == api.WorkloadExited
	})
	out, err := p.Output(ctx, "run-o", "a1")
	require.NoError(t, err)
	require.True(t, out.Truncated)
	require.Len(t, out.Stdout, api.MaxOutputTail)
	require.True(t, strings.HasSuffix(out.Stdout, "z\nlast line\n"))
	require.Equal(t, "bad \uFFFD byte\n", out.Stderr)
}
