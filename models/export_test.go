package models

// LaneOf is laneOf for the external tests: the write lane of a node among
// n lanes.
var LaneOf = laneOf

// QueuedExclusive answers how many requests wait in the store's exclusive
// lane for the next batch.
func QueuedExclusive(s *FleetStore) int {
	l := s.group.excl
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}
