package state

import (
	"errors"
	"io/fs"
	"maps"
	"slices"
	"strings"
)

// fileOutputs holds the attempts whose output is owed to the control plane:
// recorded before their exit is spooled, removed once the server took the
// output, so an exit whose output was not yet uploaded is uploaded after a
// restart (DECISIONS §43). The output itself stays in the attempt's logs.
const fileOutputs = "outputs.json"

// OwedOutput names an exited attempt whose output has not been delivered.
type OwedOutput struct {
	RunID     string `json:"run_id"`
	AttemptID string `json:"attempt_id"`
}

func (o OwedOutput) key() string { return o.RunID + "/" + o.AttemptID }

func compareOwed(a, b OwedOutput) int { return strings.Compare(a.key(), b.key()) }

func (s *Store) loadOutputs() error {
	var owed []OwedOutput
	if err := ReadJSON(s.Path(fileOutputs), &owed); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.outputs = map[string]OwedOutput{}
	for _, o := range owed {
		s.outputs[o.key()] = o
	}
	return nil
}

func (s *Store) writeOutputsLocked(next map[string]OwedOutput) error {
	list := slices.SortedFunc(maps.Values(next), compareOwed)
	if list == nil {
		list = []OwedOutput{}
	}
	if err := WriteJSONAtomic(s.Path(fileOutputs), list, s.durable); err != nil {
		return err
	}
	s.outputs = next
	return nil
}

// OweOutput durably records that the attempt's output is owed. Recording
// it again changes nothing.
func (s *Store) OweOutput(o OwedOutput) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.outputs[o.key()]; ok {
		return nil
	}
	next := maps.Clone(s.outputs)
	next[o.key()] = o
	return s.writeOutputsLocked(next)
}

// OwedOutputs lists the owed outputs, ordered by run and attempt.
func (s *Store) OwedOutputs() []OwedOutput {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.SortedFunc(maps.Values(s.outputs), compareOwed)
}

// OutputDelivered durably forgets an owed output.
func (s *Store) OutputDelivered(o OwedOutput) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.outputs[o.key()]; !ok {
		return nil
	}
	next := maps.Clone(s.outputs)
	delete(next, o.key())
	return s.writeOutputsLocked(next)
}
