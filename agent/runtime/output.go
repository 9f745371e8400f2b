package runtime

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/nodeward/nodeward/agent/api"
)

// Output is what an attempt wrote last: the tail of each stream as report
// text (see TailText), and whether either stream was longer than its tail.
type Output struct {
	Stdout    string
	Stderr    string
	Truncated bool
}

// TailText turns the last bytes of a stream into the text an output report
// carries: at most api.MaxOutputTail bytes of valid UTF-8 without NUL.
// Invalid UTF-8 sequences and NUL bytes become U+FFFD (the wire is JSON text
// and Postgres text cannot hold NUL); when cut is true (the stream began
// before last) a character split by the cut is dropped rather than shown as
// U+FFFD. Replacement can lengthen the text, so it is trimmed again from the
// front at a character boundary. truncated reports whether anything of the
// stream is missing from the answer.
func TailText(last []byte, cut bool) (text string, truncated bool) {
	if len(last) > api.MaxOutputTail {
		last, cut = last[len(last)-api.MaxOutputTail:], true
	}
	if cut {
		// At most three continuation bytes can belong to a character that
		// began before the cut.
		for i := 0; i < 3 && len(last) > 0 && !utf8.RuneStart(last[0]); i++ {
			last = last[1:]
		}
	}
	s := strings.ToValidUTF8(string(last), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) > api.MaxOutputTail {
		i := len(s) - api.MaxOutputTail
		for !utf8.RuneStart(s[i]) {
			i++
		}
		s, cut = s[i:], true
	}
	return s, cut
}

// readTail reads the tail of a log file; a missing file is an empty stream
// (the workload never started, or wrote nothing before the file existed).
func readTail(path string) (string, bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read output: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", false, fmt.Errorf("read output: %w", err)
	}
	start := max(0, fi.Size()-api.MaxOutputTail)
	buf, err := io.ReadAll(io.NewSectionReader(f, start, fi.Size()-start))
	if err != nil {
		return "", false, fmt.Errorf("read output: %w", err)
	}
	text, truncated := TailText(buf, start > 0)
	return text, truncated, nil
}
