package fleet

import (
	"fmt"
	"strings"
)

// NotificationKind says what changed.
type NotificationKind string

// Notification kinds.
const (
	// NotifyCommands: the node has new work; wake its long-poll.
	NotifyCommands NotificationKind = "c"
	// NotifyIssued: NotifyCommands for a command a commit just recorded:
	// the node's long-polls go straight to the claim, skipping the read
	// that would only confirm it — on the replica that recorded it and on
	// the others alike, since a notification reaches them only once the
	// commit is visible.
	NotifyIssued NotificationKind = "i"
	// NotifyNode: the node's record changed (fencing token, state,
	// capabilities); drop cached copies (nodeCache), and end its
	// long-polls if it was retired or fenced.
	NotifyNode NotificationKind = "n"
	// NotifyResync: notifications may have been missed (a listener
	// reconnected); drop every cache and wake every long-poll to re-check.
	NotifyResync NotificationKind = "r"
	// NotifyOperation: an operation of the ledger changed; NodeID carries
	// the operation's id. The fleet ignores it; the ledger wakes its
	// waiters and dispatcher.
	NotifyOperation NotificationKind = "o"
	// NotifyChildEnded: a child of the fan-out operation NodeID ended on
	// this replica (never sent to others); the ledger advances the parent.
	NotifyChildEnded NotificationKind = "p"
	// NotifyDispatch: operation NodeID was recorded (or handed back by
	// recovery) and may be claimed; dispatchers look for work.
	NotifyDispatch NotificationKind = "d"
	// NotifyCredentials: the credentials of the subject NodeID carries
	// (auth.TokenSubject, HostSubject, SessionSubject) were revoked; the
	// fleet ignores it; the administrators' service drops what it cached.
	NotifyCredentials NotificationKind = "a"
	// NotifyHanded: the transaction that recorded a command for node
	// NodeID recorded it delivered to a long-poll this replica holds
	// (Service.pollToHand, handToHeldPolls); once committed, the commands are handed
	// to that poll. It stands in for the command's NotifyIssued here and
	// is never sent to others (Local).
	NotifyHanded NotificationKind = "h"
	// NotifyPeer: a replica's listener has just connected, so notifications
	// now reach it. A replica that saw no other (Service.watchPeers) starts
	// announcing again, after a resync covers what it did not announce.
	// Sent by the listener itself, outside any transaction.
	NotifyPeer NotificationKind = "j"
)

// Notification is one change other replicas must hear about.
type Notification struct {
	Kind   NotificationKind
	NodeID string
	// handoff is a NotifyHanded's poll and commands.
	handoff *handoff
}

// Local reports a notification this replica alone acts on: a store never
// sends it to the others.
func (n Notification) Local() bool { return n.Kind == NotifyHanded || n.Kind == NotifyChildEnded }

// MayFollowCommit reports a notification that only wakes readers which
// read the committed state themselves: a store may send it to the other
// replicas after the commit that made it instead of inside it. Were it
// lost (the sender died in between), nothing is lost but time: the other
// replicas resync when they see the sender gone (Service.watchPeers),
// and their polls and waiters read again at their own fallbacks. What
// voids what a replica knows — a node's fencing or state, revoked
// credentials — is never sent so.
func (n Notification) MayFollowCommit() bool {
	switch n.Kind {
	case NotifyCommands, NotifyIssued, NotifyOperation, NotifyDispatch:
		return true
	}
	return false
}

// Encode renders the notification as a NOTIFY payload stamped with the
// sending replica, so a replica can skip its own.
func (n Notification) Encode(replica string) string {
	return string(n.Kind) + ":" + replica + ":" + n.NodeID
}

// DecodeNotification parses a payload made by Encode.
func DecodeNotification(payload string) (Notification, string, error) {
	kind, rest, ok := strings.Cut(payload, ":")
	if !ok {
		return Notification{}, "", fmt.Errorf("malformed notification %q", payload)
	}
	replica, node, ok := strings.Cut(rest, ":")
	if !ok {
		return Notification{}, "", fmt.Errorf("malformed notification %q", payload)
	}
	return Notification{Kind: NotificationKind(kind), NodeID: node}, replica, nil
}
