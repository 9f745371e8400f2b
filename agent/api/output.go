package api

// MaxOutputTail is the most of one stream an output report carries: the last
// 64 KiB (DECISIONS §43), counted in bytes of the UTF-8 text sent.
const MaxOutputTail = 64 << 10

// OutputRequest is the body of POST /agent/v1/output: what an exited attempt
// wrote last. The tails are text: the agent replaces invalid UTF-8 and NUL
// bytes with U+FFFD before sending, so a JSON string carries them unchanged.
// Truncated is true when either stream was longer than its tail.
type OutputRequest struct {
	RunID      string `json:"run_id"`
	AttemptID  string `json:"attempt_id"`
	StdoutTail string `json:"stdout_tail"`
	StderrTail string `json:"stderr_tail"`
	Truncated  bool   `json:"truncated"`
}

// OutputResponse answers POST /agent/v1/output. Recorded is false when output
// for the attempt had been recorded before: the first report is kept.
type OutputResponse struct {
	Recorded bool `json:"recorded"`
}
