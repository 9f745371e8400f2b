package models

// LaneOf is laneOf for the external tests: the write lane of a node among
// n lanes.
var LaneOf = laneOf
